"""calls.log: private JSONL, bounded redacted excerpts, never the message, never raising."""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path
from typing import Any

import attrs
import pytest
from twisted.logger import capturedLogs

from agentcall.listener import calllog
from agentcall.listener.calllog import (
    CallLog,
    CallRecord,
    CallStatus,
    LoggedCall,
    format_ts,
    read_tail,
)

CALL_ID = "6f1c2a4e-8b7d-4c3e-9a1f-0123456789ab"
TOKEN = "relay-token-Zq8xW3vN5tR7yU1iO9pL"
RECORD = CallRecord(
    at=1_700_000_000.25,
    call_id=CALL_ID,
    caller="@acme/ana",
    task="review",
    status=CallStatus.OK,
    duration_ms=1234,
    outcome_text="All good.",
)


def lines(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text("utf-8").splitlines()]


def test_line_has_exactly_the_documented_fields(tmp_path: Path) -> None:
    """One JSON object per call with ts, call_id, caller, task, status, duration and excerpt."""
    path = tmp_path / "calls.log"
    assert CallLog(path).append(RECORD)
    (entry,) = lines(path)
    assert entry == {
        "ts": "2023-11-14T22:13:20.250Z",
        "call_id": CALL_ID,
        "caller": "@acme/ana",
        "task": "review",
        "status": "ok",
        "duration_ms": 1234,
        "excerpt": "All good.",
    }


def test_optional_error_and_flags_appear_when_given(tmp_path: Path) -> None:
    """An error detail and flags are written only when present."""
    path = tmp_path / "calls.log"
    record = attrs.evolve(
        RECORD, status=CallStatus.BLOCKED, error="refused", flags=("blocked_caller_attempt",)
    )
    CallLog(path).append(record)
    (entry,) = lines(path)
    assert entry["status"] == "blocked"
    assert entry["error"] == "refused"
    assert entry["flags"] == ["blocked_caller_attempt"]


def test_lines_are_appended(tmp_path: Path) -> None:
    """Each call adds one line after the earlier ones."""
    path = tmp_path / "calls.log"
    log = CallLog(path)
    for status in (CallStatus.OK, CallStatus.BUSY, CallStatus.TIMEOUT):
        log.append(attrs.evolve(RECORD, status=status))
    assert [entry["status"] for entry in lines(path)] == ["ok", "busy", "timeout"]


def test_file_is_created_private(tmp_path: Path) -> None:
    """A new calls.log is created with mode 0600 whatever the umask."""
    path = tmp_path / "calls.log"
    old = os.umask(0)
    try:
        CallLog(path).append(RECORD)
    finally:
        os.umask(old)
    assert stat.S_IMODE(path.stat().st_mode) == 0o600


def test_existing_wide_file_is_tightened(tmp_path: Path) -> None:
    """A calls.log left readable by others is narrowed to 0600 on the next write."""
    path = tmp_path / "calls.log"
    path.write_text("")
    path.chmod(0o644)
    CallLog(path).append(RECORD)
    assert stat.S_IMODE(path.stat().st_mode) == 0o600


def test_excerpt_is_bounded_and_redacted_before_cut(tmp_path: Path) -> None:
    """The excerpt is at most 200 chars, with keys and the relay token redacted first."""
    path = tmp_path / "calls.log"
    reply = f"{TOKEN} " + "x" * 175 + " sk-" + "live-0123456789abcdefghij" + " " + "y" * 5000
    CallLog(path, secrets=[TOKEN]).append(attrs.evolve(RECORD, outcome_text=reply))
    (entry,) = lines(path)
    assert len(entry["excerpt"]) == calllog.MAX_EXCERPT_CHARS
    assert entry["excerpt"].startswith("[redacted] xxx")
    assert "sk-" not in entry["excerpt"]
    assert TOKEN not in path.read_text()


def test_error_detail_is_bounded_and_redacted(tmp_path: Path) -> None:
    """An error detail is redacted and cut to 500 characters."""
    path = tmp_path / "calls.log"
    error = "ghp_" + "A1b2C3d4E5f6G7h8I9j0K1l2M3n4O5p6Q7r8 " + "z" * 2000
    CallLog(path).append(attrs.evolve(RECORD, status=CallStatus.AGENT_ERROR, error=error))
    (entry,) = lines(path)
    assert len(entry["error"]) == calllog.MAX_ERROR_CHARS
    assert entry["error"].startswith("[redacted] zzz")


def test_record_has_no_place_for_the_message() -> None:
    """A record has no field that could carry the caller's message."""
    names = {field.name for field in attrs.fields(CallRecord)}
    assert not {name for name in names if "message" in name or "prompt" in name}
    assert names == {
        "at",
        "call_id",
        "caller",
        "task",
        "status",
        "duration_ms",
        "outcome_text",
        "error",
        "flags",
    }


def test_bad_flag_is_refused() -> None:
    """Flags are short identifiers, not free text."""
    with pytest.raises(ValueError):
        attrs.evolve(RECORD, flags=("caller said: rm -rf",))


def test_write_failure_is_logged_not_raised(tmp_path: Path) -> None:
    """A missing directory makes append return False and log an event, never raise."""
    path = tmp_path / "gone" / "calls.log"
    secret_reply = "the reply text must not be logged"
    with capturedLogs() as captured:
        assert CallLog(path).append(attrs.evolve(RECORD, outcome_text=secret_reply)) is False
    (event,) = [e for e in captured if e.get("event") == "calls_log_write_failed"]
    assert event["path"] == str(path)
    assert event["error"] == "FileNotFoundError"
    assert secret_reply not in repr(event)


def test_symlinked_log_is_not_followed(tmp_path: Path) -> None:
    """A calls.log that is a symlink is refused rather than written through."""
    target = tmp_path / "elsewhere"
    target.write_text("")
    (tmp_path / "calls.log").symlink_to(target)
    assert CallLog(tmp_path / "calls.log").append(RECORD) is False
    assert target.read_text() == ""


def test_timestamps_are_utc_iso8601() -> None:
    """Timestamps are ISO 8601 in UTC with millisecond precision and a Z."""
    assert format_ts(0.0) == "1970-01-01T00:00:00.000Z"


def test_read_tail_returns_newest_in_order(tmp_path: Path) -> None:
    """read_tail gives the last N entries, oldest first, skipping broken lines."""
    path = tmp_path / "calls.log"
    log = CallLog(path)
    for n in range(5):
        log.append(attrs.evolve(RECORD, duration_ms=n))
    with path.open("a") as log_file:
        log_file.write('not json\n{"ts": 1}\n[]\n{"torn": ')
    tail = read_tail(path, 3)
    assert [entry.duration_ms for entry in tail] == [2, 3, 4]
    assert tail[0] == LoggedCall(
        ts="2023-11-14T22:13:20.250Z",
        call_id=CALL_ID,
        caller="@acme/ana",
        task="review",
        status="ok",
        duration_ms=2,
        excerpt="All good.",
    )
    assert read_tail(path, 0) == ()


def test_read_tail_of_missing_log_is_empty(tmp_path: Path) -> None:
    """No calls.log yet reads as no history."""
    assert read_tail(tmp_path / "calls.log", 20) == ()


def test_read_tail_scans_only_the_end(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Only the newest bytes are read, and the fragment at the scan start is dropped."""
    path = tmp_path / "calls.log"
    log = CallLog(path)
    for n in range(10):
        log.append(attrs.evolve(RECORD, duration_ms=n))
    line_length = len(path.read_bytes().splitlines(keepends=True)[0])
    monkeypatch.setattr(calllog, "TAIL_SCAN_BYTES", line_length * 3 + 5)
    assert [entry.duration_ms for entry in read_tail(path, 100)] == [7, 8, 9]
