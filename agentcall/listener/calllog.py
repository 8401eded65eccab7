"""``calls.log``: one JSON object per answered, refused or failed inbound call.

The log is the owner's record of who called and what came of it, not a transcript. It holds
no caller message at all — a record has no field that could take one — and of the reply or
error only a short excerpt, redacted before it is cut. The file is private (0600) and is
appended to with one ``write`` per line, so a line is never interleaved with another.

Writing is best effort: a full disk or a removed directory is logged and swallowed, because a
call that was answered must not turn into a failure for the sake of its log line.
"""

from __future__ import annotations

import datetime
import enum
import errno
import json
import os
import re
from collections.abc import Iterable
from typing import Any, Final

import attrs

from agentcall.limits import MAX_DETAIL_CHARS
from agentcall.listener.redact import redacted_excerpt
from agentcall.logevents import Logger

MAX_EXCERPT_CHARS: Final = 200
MAX_ERROR_CHARS: Final = MAX_DETAIL_CHARS
# history scans only the newest part of the file, so a long-lived log never makes it slow.
TAIL_SCAN_BYTES: Final = 4 * 1024 * 1024

_FLAG_RE = re.compile(r"^[a-z][a-z0-9_]{0,63}\Z")
_log = Logger(namespace="agentcall.listener.calllog")


class CallStatus(enum.StrEnum):
    """How an inbound call ended, as the owner reads it in ``history``."""

    OK = "ok"
    BLOCKED = "blocked"
    TASK_UNKNOWN = "task_unknown"
    TASK_NOT_OFFERED = "task_not_offered"
    BUSY = "busy"
    TIMEOUT = "timeout"
    AGENT_ERROR = "agent_error"
    PROTOCOL_ERROR = "protocol_error"
    POLICY_ERROR = "policy_error"
    CANCELED = "canceled"
    CONTEXT_UNKNOWN = "context_unknown"


def _as_tuple(items: Iterable[str]) -> tuple[str, ...]:
    return tuple(items)


def _check_flags(
    _instance: object, _attribute: attrs.Attribute[Any], flags: tuple[str, ...]
) -> None:
    for flag in flags:
        if not _FLAG_RE.match(flag):
            raise ValueError("a calls.log flag must be a short lowercase identifier")


@attrs.frozen
class CallRecord:
    """One call's outcome, as handed to :meth:`CallLog.append`.

    ``outcome_text`` is the reply (for ``ok``) or the error the caller was told; only a
    redacted excerpt of it is written. ``error`` is an optional internal detail for the owner.
    ``at`` is POSIX seconds from the listener's clock.
    """

    at: float
    call_id: str
    caller: str
    task: str | None
    status: CallStatus
    duration_ms: int = attrs.field(validator=attrs.validators.ge(0))
    outcome_text: str = ""
    error: str | None = None
    flags: tuple[str, ...] = attrs.field(default=(), converter=_as_tuple, validator=_check_flags)


@attrs.frozen
class LoggedCall:
    """One line of ``calls.log`` as read back for ``history``."""

    ts: str
    call_id: str
    caller: str
    task: str | None
    status: str
    duration_ms: int
    excerpt: str
    error: str | None = None
    flags: tuple[str, ...] = ()


def format_ts(at: float) -> str:
    """ISO 8601 in UTC with milliseconds and a ``Z``: ``2025-01-31T09:30:00.250Z``."""
    moment = datetime.datetime.fromtimestamp(at, tz=datetime.UTC)
    return moment.isoformat(timespec="milliseconds").replace("+00:00", "Z")


def encode_record(record: CallRecord, *, secrets: Iterable[str] = ()) -> str:
    """The JSON line (with its newline) written for ``record``."""
    secrets = tuple(secrets)
    line: dict[str, Any] = {
        "ts": format_ts(record.at),
        "call_id": record.call_id,
        "caller": record.caller,
        "task": record.task,
        "status": str(record.status),
        "duration_ms": record.duration_ms,
        "excerpt": redacted_excerpt(record.outcome_text, MAX_EXCERPT_CHARS, secrets=secrets),
    }
    if record.error is not None:
        line["error"] = redacted_excerpt(record.error, MAX_ERROR_CHARS, secrets=secrets)
    if record.flags:
        line["flags"] = list(record.flags)
    return json.dumps(line, ensure_ascii=False, separators=(",", ":")) + "\n"


class CallLog:
    """Appends :class:`CallRecord` lines to one ``calls.log``; the directory must exist."""

    def __init__(self, path: str | os.PathLike[str], *, secrets: Iterable[str] = ()) -> None:
        self.path = os.fspath(path)
        # Exact secrets of this installation (the relay token) redacted from every line.
        self._secrets = tuple(secrets)

    def append(self, record: CallRecord) -> bool:
        """Write one line; return whether it was written. Never raises."""
        try:
            data = encode_record(record, secrets=self._secrets).encode("utf-8", "replace")
            self._write(data)
        except Exception as failure:
            # Only the path and the kind of failure: the record itself may hold reply text.
            _log.warn(
                "calls_log_write_failed",
                path=self.path,
                error=type(failure).__name__,
                errno=getattr(failure, "errno", None),
            )
            return False
        return True

    def _write(self, data: bytes) -> None:
        flags = os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW
        fd = os.open(self.path, flags, 0o600)
        try:
            # A file created by hand or by an older version may be wider than 0600.
            if os.fstat(fd).st_mode & 0o077:
                os.fchmod(fd, 0o600)
            view = memoryview(data)
            while view:
                written = os.write(fd, view)
                view = view[written:]
        finally:
            os.close(fd)


def _parse_line(raw: bytes) -> LoggedCall | None:
    try:
        item = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, ValueError):
        return None
    if not isinstance(item, dict):
        return None
    text_fields = ("ts", "call_id", "caller", "status", "excerpt")
    if not all(isinstance(item.get(name), str) for name in text_fields):
        return None
    task, error, flags = item.get("task"), item.get("error"), item.get("flags", [])
    duration = item.get("duration_ms")
    if not isinstance(duration, int) or isinstance(duration, bool):
        return None
    if not (task is None or isinstance(task, str)) or not (error is None or isinstance(error, str)):
        return None
    if not isinstance(flags, list) or not all(isinstance(flag, str) for flag in flags):
        return None
    return LoggedCall(
        ts=item["ts"],
        call_id=item["call_id"],
        caller=item["caller"],
        task=task,
        status=item["status"],
        duration_ms=duration,
        excerpt=item["excerpt"],
        error=error,
        flags=tuple(flags),
    )


def read_tail(path: str | os.PathLike[str], limit: int) -> tuple[LoggedCall, ...]:
    """The newest ``limit`` well-formed entries, oldest first; a missing log reads as empty.

    Only the last :data:`TAIL_SCAN_BYTES` of the file are read. Lines that are not valid
    entries (a torn last line, hand edits) are skipped. Other read errors propagate.
    """
    if limit < 0:
        raise ValueError("limit must not be negative")
    try:
        with open(path, "rb") as log_file:
            size = log_file.seek(0, os.SEEK_END)
            start = max(0, size - TAIL_SCAN_BYTES)
            log_file.seek(start)
            chunk = log_file.read(TAIL_SCAN_BYTES)
    except OSError as failure:
        if failure.errno == errno.ENOENT:
            return ()
        raise
    lines = chunk.split(b"\n")
    if start > 0:
        # The scan began mid-file, so its first line is a fragment.
        lines = lines[1:]
    entries = [entry for entry in map(_parse_line, lines) if entry is not None]
    return tuple(entries[-limit:]) if limit else ()
