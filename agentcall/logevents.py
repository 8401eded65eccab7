"""Structured log events with a fixed vocabulary.

Code logs ``log.info("call_ringing", call_id=..., org=...)``: the first argument is the event
name, the keywords are its fields. :class:`Logger` fills in a text format that shows every
field (``call_ringing call_id=… org=…``) so plain-text logs stay useful, and records the name
as ``event`` so JSON logs and tests can select on it. Never pass a secret, a message, a reply
or ciphertext as a field.

A program chooses the lowest level it writes once, at start-up (:func:`configure_from_environ`
in the relay's and the listener's tap: ``AGENTCALL_LOG_LEVEL``, default ``info``). An event
below it is dropped in :meth:`Logger.emit` before any format is built or observer called, so a
``debug`` line costs one set lookup when debug is off. Until a program chooses, every level is
written (library use, tests).
"""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Mapping
from typing import Any, TypeVar

from twisted.logger import ILogObserver, LogLevel
from twisted.logger import Logger as _TwistedLogger
from twisted.python.failure import Failure
from zope.interface import implementer

from agentcall.errors import LoggedInAggregate

P = TypeVar("P")
LEVEL_ENV = "AGENTCALL_LOG_LEVEL"
DEFAULT_LEVEL: LogLevel = LogLevel.info

# Lowest first, as twisted.logger ranks them.
_ORDER: tuple[LogLevel, ...] = (
    LogLevel.debug,
    LogLevel.info,
    LogLevel.warn,
    LogLevel.error,
    LogLevel.critical,
)
# Changed in place (never rebound), so every Logger reads the current choice.
_enabled: set[LogLevel] = set(_ORDER)


def set_level(lowest: LogLevel) -> None:
    """Write events at ``lowest`` and above; drop the rest as early as possible."""
    chosen = _ORDER[_ORDER.index(lowest) :]
    _enabled.intersection_update(chosen)
    _enabled.update(chosen)


def level_enabled(level: LogLevel) -> bool:
    return level in _enabled


def lowest_level() -> LogLevel:
    return next(level for level in _ORDER if level in _enabled)


def level_from_environ(environ: Mapping[str, str]) -> LogLevel:
    """The level ``AGENTCALL_LOG_LEVEL`` names (debug, info, warn, error, critical; default
    info). Raises ValueError for anything else, so a typo is not silently ignored."""
    name = environ.get(LEVEL_ENV, "").strip().lower()
    if not name:
        return DEFAULT_LEVEL
    if name == "warning":
        name = "warn"
    for level in _ORDER:
        if level.name == name:
            return level
    names = ", ".join(level.name for level in _ORDER)
    raise ValueError(f"{LEVEL_ENV}={name!r} is not a log level ({names})")


def configure_from_environ(environ: Mapping[str, str] | None = None) -> LogLevel:
    """Set the level from ``AGENTCALL_LOG_LEVEL`` (see :func:`level_from_environ`)."""
    level = level_from_environ(os.environ if environ is None else environ)
    set_level(level)
    return level


class Logger(_TwistedLogger):
    def emit(self, level: LogLevel, format: str | None = None, **kwargs: Any) -> None:
        if level not in _enabled:
            return
        if format is not None and "{" not in format:
            kwargs.setdefault("event", format)
            # The line is rendered here, once, with its values in place (braces escaped), so
            # the text observer's formatter has nothing left to substitute: filling a template
            # of {name!r} fields field by field cost more than the rest of a call's log work.
            text = " ".join(
                [
                    format,
                    *(
                        f"{k}={v!r}"
                        for k, v in kwargs.items()
                        if k not in {"event", "failure"} and not k.startswith("log_")
                    ),
                ]
            )
            format = text.replace("{", "{{").replace("}", "}}")
        super().emit(level, format, **kwargs)

    def failure(
        self,
        format: str,
        failure: Failure | None = None,
        level: LogLevel = LogLevel.critical,
        **kwargs: Any,
    ) -> None:
        """As Twisted's, except for a failure logged in aggregate elsewhere (the storage
        failing, a dropped audit row): one debug line without a traceback, since every request
        meanwhile would otherwise add a traceback (to a full disk, as like as not)."""
        if failure is None:
            failure = Failure()
        if isinstance(failure.value, LoggedInAggregate):
            self.emit(LogLevel.debug, format, reason=str(failure.value), **kwargs)
            return
        super().failure(format, failure, level, **kwargs)


# What every JSON line starts with; then the event's own fields.
_LEVEL_NAMES = {
    LogLevel.debug: "debug",
    LogLevel.info: "info",
    LogLevel.warn: "warning",
    LogLevel.error: "error",
    LogLevel.critical: "critical",
}


def json_line(event: Mapping[str, Any]) -> str:
    """One event as one JSON object on one line: ``ts`` (UTC, ISO 8601, milliseconds),
    ``level``, ``event`` (our event name; for Twisted's own events their formatted text), then
    the fields. A value JSON cannot hold is written as its repr; a failure as its type, message
    and traceback. No ``log_`` bookkeeping."""
    import datetime
    import json

    from twisted.logger import formatEvent

    at = datetime.datetime.fromtimestamp(event.get("log_time", 0.0), datetime.UTC)
    level = event.get("log_level")
    record: dict[str, Any] = {
        "ts": at.isoformat(timespec="milliseconds").replace("+00:00", "Z"),
        "level": _LEVEL_NAMES.get(level, "info"),
        "event": event.get("event") or formatEvent(dict(event)),
    }
    for key, value in event.items():
        if key in ("event", "log_failure") or key.startswith("log_") or key in record:
            continue
        record[key] = value if _plain(value) else repr(value)
    failure = event.get("log_failure")
    if failure is not None:
        record["failure"] = {
            "type": getattr(failure.type, "__name__", str(failure.type)),
            "message": str(failure.value),
            "traceback": failure.getTraceback(),
        }
    return json.dumps(record, ensure_ascii=False, separators=(",", ":"))


def _plain(value: object) -> bool:
    return value is None or isinstance(value, (str, int, float, bool))


@implementer(ILogObserver)
class JsonLinesObserver:
    """Writes :func:`json_line` of each event to ``out``, flushed: journald, Loki, jq and
    every line-based tool read it as is (no RFC 7464 record separators)."""

    def __init__(self, out: Any) -> None:
        self._out = out

    def __call__(self, event: Mapping[str, Any]) -> None:
        self._out.write(json_line(event) + "\n")
        self._out.flush()


def json_stdout_observer() -> ILogObserver:
    """For ``twistd --logger agentcall.logevents.json_stdout_observer`` (which ``--log-format
    json`` of both daemons names): one JSON object per line on stdout."""
    return JsonLinesObserver(sys.stdout)


def use_log_format(options: Any, chosen: str) -> None:
    """Act on a daemon's ``--log-format`` while its options are parsed: ``json`` asks twistd
    (the plugin's parent options, read before logging starts) for :func:`json_stdout_observer`;
    ``text`` leaves twistd's default. Nothing outside ``options`` changes."""
    from twisted.python import usage

    if chosen not in ("text", "json"):
        raise usage.UsageError("--log-format must be text or json")
    parent = getattr(options, "parent", None)
    if chosen == "json" and parent is not None:
        parent["logger"] = "agentcall.logevents.json_stdout_observer"


def quiet_factories() -> None:
    """Turn Twisted's per-factory start/stop lines off, for the whole process (one pair per
    connection on the listener's side). A daemon does this when it builds its service."""
    from twisted.internet import protocol

    protocol.Factory.noisy = False


def _no_delay(protocol: Any) -> None:
    """Set TCP_NODELAY as the connection's ``tcpNoDelay`` option says.

    autobahn's Twisted ``connectionMade`` sets it from that option before ``_connectionMade``
    has copied the options into the connection, and swallows the AttributeError: Nagle's
    algorithm then stayed on, and held a small frame written behind one not yet acknowledged
    until the peer's delayed ACK (up to 40 ms on Linux). A transport without the option (a UNIX
    socket, a test's memory transport) is left as it is.
    """
    setter = getattr(getattr(protocol, "transport", None), "setTcpNoDelay", None)
    if setter is None:
        return
    with contextlib.suppress(AttributeError, OSError):
        setter(bool(protocol.tcpNoDelay))


def without_option_dump(cls: type[P]) -> type[P]:
    """Class decorator for an autobahn WebSocket protocol: each new connection copies the
    factory's protocol options the way autobahn does, without autobahn's per-connection
    ``pformat`` of every option. autobahn builds that text for its debug log even when debug
    is off; it was about a sixth of the relay's busy CPU per socket.

    autobahn's ``_connectionMade`` walks ``CONFIG_ATTRS``: the class gets an empty list, and
    its ``_connectionMade`` first does the copy itself over the names autobahn declared.
    """
    protocol: Any = cls
    names = tuple(protocol.CONFIG_ATTRS)
    inherited = protocol._connectionMade

    def _connectionMade(self: Any) -> None:
        factory = self.factory
        # A class that has the option itself (the relay's) had it applied by autobahn already.
        late = not hasattr(self, "tcpNoDelay")
        for name in names:
            if not hasattr(self, name):
                setattr(self, name, getattr(factory, name))
        if late:
            _no_delay(self)
        inherited(self)

    protocol.CONFIG_ATTRS = []
    protocol._connectionMade = _connectionMade
    return cls
