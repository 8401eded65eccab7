"""Structured log events with a fixed vocabulary.

Code logs ``log.info("call_ringing", call_id=..., org=...)``: the first argument is the event
name, the keywords are its fields. :class:`Logger` fills in a text format that shows every
field (``call_ringing call_id=… org=…``) so plain-text logs stay useful, and records the name
as ``event`` so JSON logs and tests can select on it. Never pass a secret, a message, a reply
or ciphertext as a field.
"""

from __future__ import annotations

import sys
from typing import Any

from twisted.logger import ILogObserver, LogLevel, jsonFileLogObserver
from twisted.logger import Logger as _TwistedLogger


class Logger(_TwistedLogger):
    def emit(self, level: LogLevel, format: str | None = None, **kwargs: Any) -> None:
        if format is not None and "{" not in format:
            fields = [k for k in kwargs if not k.startswith("log_") and k != "failure"]
            kwargs.setdefault("event", format)
            format = " ".join([format, *(f"{k}={{{k}!r}}" for k in fields if k != "event")])
        super().emit(level, format, **kwargs)


def json_stdout_observer() -> ILogObserver:
    """For ``twistd --logger agentcall.logevents.json_stdout_observer``: JSON lines on stdout."""
    return jsonFileLogObserver(sys.stdout)
