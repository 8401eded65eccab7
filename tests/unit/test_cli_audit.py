"""`agentcall audit export|hold` against a fake relay API: formats written as events arrive,
--output whole or not at all, UTC dates, holds."""

from __future__ import annotations

import csv
import io
import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import attrs
import pytest
from twisted.internet import defer

from agentcall.cli import audit as audit_cli
from agentcall.cli import call as call_cli
from agentcall.cli.main import main
from agentcall.client.api import ExportIncomplete, RelayUnreachable
from agentcall.errors import ApiError, ApiErrorCode
from agentcall.wire.http import (
    AuditEvent,
    AuditExportEnd,
    AuditHold,
    AuditHoldList,
    HoldScope,
)
from tests.unit.cli_helpers import install, isolate, run_with_clock

T_MS = 1_767_225_600_000  # 2026-01-01T00:00:00Z


def event(n: int, **changes: Any) -> AuditEvent:
    made = AuditEvent(id=n, at_ms=T_MS + n * 1_001, event="call.submit", actor="ann", target="ken")
    return attrs.evolve(made, **changes)


@attrs.define
class FakeApi:
    events: list[AuditEvent] = attrs.field(factory=list)
    # Called after each event the fake hands over (a test looks at what is on disk then).
    after_each: Callable[[int], None] | None = None
    cut_after: int | None = None  # stop short, as a broken connection would
    failure: Exception | None = None
    requests: list[object] = attrs.field(factory=list)
    holds: list[AuditHold] = attrs.field(factory=list)

    def export_audit(
        self, on_event: Callable[[AuditEvent], None], *, since: int | None = None,
        until: int | None = None,
    ) -> defer.Deferred[AuditExportEnd]:  # fmt: skip
        self.requests.append(("export", since, until))
        if self.failure is not None:
            return defer.fail(self.failure)
        try:
            for n, item in enumerate(self.events):
                if self.cut_after is not None and n == self.cut_after:
                    raise ExportIncomplete(f"stopped after {n} events without its end line", n)
                on_event(item)
                if self.after_each is not None:
                    self.after_each(n)
        except Exception as exc:
            return defer.fail(exc)
        return defer.succeed(AuditExportEnd(complete=True, events=len(self.events)))

    def set_hold(self, handle: str | None, note: str | None = None) -> defer.Deferred[AuditHold]:
        self.requests.append(("set", handle, note))
        if self.failure is not None:
            return defer.fail(self.failure)
        scope = HoldScope.ORGANISATION if handle is None else HoldScope.HANDLE
        return defer.succeed(AuditHold(scope, handle, 1_767_225_600, "ann", note))

    def clear_hold(self, handle: str | None) -> defer.Deferred[AuditHold]:
        self.requests.append(("clear", handle))
        if self.failure is not None:
            return defer.fail(self.failure)
        scope = HoldScope.ORGANISATION if handle is None else HoldScope.HANDLE
        return defer.succeed(AuditHold(scope, handle, 1_767_225_600, "ann"))

    def list_holds(self) -> defer.Deferred[AuditHoldList]:
        self.requests.append(("list",))
        return defer.succeed(AuditHoldList(tuple(self.holds)))


@pytest.fixture
def api(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> FakeApi:
    install(isolate(monkeypatch, tmp_path))  # an installation of @acme/ann
    fake = FakeApi()
    monkeypatch.setattr(call_cli, "relay_api", lambda _reactor, _config: fake)
    monkeypatch.setattr(call_cli, "run_on_reactor", run_with_clock)
    return fake


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(["audit", *argv])
    out, err = capsys.readouterr()
    return code, out, err


# --- dates ---------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "end_of_day", "expected"),
    [
        ("2026-01-01", False, 1_767_225_600),
        ("2026-01-01", True, 1_767_225_600 + 86_400),  # --until of a date includes the day
        ("2026-01-01T12:30", True, 1_767_225_600 + 45_000),
        ("2026-01-01T12:30:15Z", False, 1_767_225_600 + 45_015),
        ("2026-01-01 12:30:15+00:00", False, 1_767_225_600 + 45_015),
        ("2024-02-29", False, 1_709_164_800),
    ],
)
def test_iso_dates_and_times_are_read_as_utc(text: str, end_of_day: bool, expected: int) -> None:
    assert audit_cli.parse_when(text, end_of_day=end_of_day) == expected


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ("2026-01-01T12:00+02:00", "must be in UTC"),
        ("2026-01-01T12:00-05:00", "must be in UTC"),
        ("2025-02-29", "not a real date"),
        ("2026-01-01T25:00", "not a real date"),
        ("yesterday", "not an ISO date"),
        ("1767225600", "not an ISO date"),
        ("01/02/2026", "not an ISO date"),
        ("2026-1-1", "not an ISO date"),
        ("", "not an ISO date"),
    ],
)
def test_anything_else_is_refused_with_the_accepted_forms(
    api: FakeApi, capsys: pytest.CaptureFixture[str], text: str, says: str
) -> None:
    with pytest.raises(SystemExit) as exited:
        run(capsys, "export", "--since", text)
    assert exited.value.code == 2
    err = capsys.readouterr().err
    assert says in err and ("YYYY-MM-DD" in err or "Z or +00:00" in err)
    assert api.requests == []


def test_since_must_come_before_until(api: FakeApi, capsys: pytest.CaptureFixture[str]) -> None:
    code, _out, err = run(capsys, "export", "--since", "2026-02-01", "--until", "2026-01-31")
    assert code == 1 and "--since must be before --until" in err
    assert api.requests == []


# --- export --------------------------------------------------------------------------------------


def test_ndjson_to_stdout_is_one_object_an_event_with_the_window_asked(
    api: FakeApi, capsys: pytest.CaptureFixture[str]
) -> None:
    api.events = [event(1), event(2, actor=None, detail="role=admin")]
    code, out, _err = run(capsys, "export", "--since", "2026-01-01", "--until", "2026-01-31")
    assert code == 0
    assert api.requests == [("export", 1_767_225_600, 1_767_225_600 + 31 * 86_400)]
    first, second = (json.loads(line) for line in out.splitlines())
    assert first == {
        "id": 1, "at": "2026-01-01T00:00:01.001Z", "at_ms": T_MS + 1_001, "org": "acme",
        "event": "call.submit", "actor": "ann", "target": "ken", "call_id": None, "detail": None,
    }  # fmt: skip
    assert (second["actor"], second["detail"]) == (None, "role=admin")


def test_csv_has_a_header_and_defuses_formulas(
    api: FakeApi, capsys: pytest.CaptureFixture[str]
) -> None:
    api.events = [event(1, target="@other/ken", detail="=HYPERLINK(1)"), event(2)]
    code, out, _err = run(capsys, "export", "--format", "csv")
    assert code == 0
    rows = list(csv.reader(io.StringIO(out)))
    assert rows[0] == list(audit_cli.COLUMNS)
    assert rows[1][audit_cli.COLUMNS.index("target")] == "'@other/ken"
    assert rows[1][audit_cli.COLUMNS.index("detail")] == "'=HYPERLINK(1)"
    assert rows[2][audit_cli.COLUMNS.index("call_id")] == ""
    assert len(rows) == 3


def test_neither_format_lets_a_terminal_act_on_what_a_relay_sent(
    api: FakeApi, capsys: pytest.CaptureFixture[str]
) -> None:
    api.events = [event(1, detail="a\x1b]52;c;cGF3bmVk\x07b\u202ec\x9bd")]
    _code, out, _err = run(capsys, "export")
    assert out.isascii() and "\x1b" not in out
    assert json.loads(out)["detail"] == "a\x1b]52;c;cGF3bmVk\x07b\u202ec\x9bd"  # exact
    _code, out, _err = run(capsys, "export", "--format", "csv")
    assert not any(ch in out for ch in "\x1b\x07\u202e\x9b")


def test_output_appears_only_once_the_export_is_whole(
    api: FakeApi, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    target = tmp_path / "audit.ndjson"
    seen: list[tuple[bool, list[str]]] = []

    def look(_n: int) -> None:
        # While the export runs the file is not there; the events go to a hidden partial file.
        seen.append((target.exists(), sorted(p.name for p in tmp_path.iterdir())))

    api.events = [event(n) for n in range(1, 4)]
    api.after_each = look
    code, out, err = run(capsys, "export", "--output", str(target))
    assert code == 0 and out == ""
    assert "exported 3 events to" in err
    assert all(not exists for exists, _names in seen)
    assert all(any(n.startswith(".audit.ndjson.") for n in names) for _e, names in seen)
    assert [json.loads(line)["id"] for line in target.read_text().splitlines()] == [1, 2, 3]
    assert os.stat(target).st_mode & 0o777 == 0o600
    assert sorted(p.name for p in tmp_path.iterdir()) == ["audit.ndjson", "home"]


def test_an_export_cut_short_leaves_no_file_and_an_older_one_alone(
    api: FakeApi, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    target = tmp_path / "audit.csv"
    target.write_text("last month's export\n")
    api.events = [event(n) for n in range(1, 5)]
    api.cut_after = 2
    code, _out, err = run(capsys, "export", "--format", "csv", "--output", str(target))
    assert code == 1
    assert "the export is incomplete" in err and f"nothing was written to {target}" in err
    assert target.read_text() == "last month's export\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["audit.csv", "home"]


def test_an_export_cut_short_on_stdout_says_so(
    api: FakeApi, capsys: pytest.CaptureFixture[str]
) -> None:
    api.events = [event(n) for n in range(1, 5)]
    api.cut_after = 2
    code, out, err = run(capsys, "export")
    assert code == 1
    assert len(out.splitlines()) == 2
    assert "what was printed is not the whole export" in err


@pytest.mark.parametrize(
    ("failure", "says"),
    [
        (ApiError(403, ApiErrorCode.FORBIDDEN, "only an organisation admin may do this"),
         "only an organisation admin may read the audit trail"),
        (RelayUnreachable("relay.example refused the connection"),
         "cannot reach the relay: relay.example refused the connection"),
    ],
)  # fmt: skip
def test_a_refused_export_leaves_no_file(
    api: FakeApi, capsys: pytest.CaptureFixture[str], tmp_path: Path, failure: Exception,
    says: str,
) -> None:  # fmt: skip
    api.failure = failure
    code, _out, err = run(capsys, "export", "--output", str(tmp_path / "a.ndjson"))
    assert code == 1 and says in err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["home"]


def test_an_unwritable_output_is_refused_before_asking(
    api: FakeApi, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    code, _out, err = run(capsys, "export", "--output", str(tmp_path / "no" / "such" / "f"))
    assert code == 1 and "cannot write" in err
    code, _out, err = run(capsys, "export", "--output", str(tmp_path))
    assert code == 1 and "is a directory" in err
    assert api.requests == []


def test_events_are_written_as_they_arrive_not_collected(
    api: FakeApi, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    target = tmp_path / "audit.ndjson"
    sizes: list[int] = []

    def look(_n: int) -> None:
        (partial,) = [p for p in tmp_path.iterdir() if p.name.endswith(".partial")]
        sizes.append(partial.stat().st_size)

    api.events = [event(n) for n in range(1, 2_001)]
    api.after_each = look
    assert run(capsys, "export", "--output", str(target))[0] == 0
    # The partial file grows during the export (the writer's buffer is flushed as it fills).
    assert sizes[-1] > 0 and sizes[0] < sizes[-1]


# --- holds ---------------------------------------------------------------------------------------


def test_hold_set_on_a_handle_or_the_organisation(
    api: FakeApi, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, _err = run(capsys, "hold", "set", "@acme/ken", "--note", "case 14")
    assert code == 0 and "legal hold on @acme/ken" in out and "(case 14)" in out
    code, out, _err = run(capsys, "hold", "set", "--org", "--json")
    assert code == 0 and json.loads(out)["scope"] == "organisation"
    assert api.requests == [("set", "ken", "case 14"), ("set", None, None)]


def test_hold_needs_exactly_one_of_a_handle_or_org(
    api: FakeApi, capsys: pytest.CaptureFixture[str]
) -> None:
    for argv in (["hold", "set"], ["hold", "set", "ken", "--org"], ["hold", "clear"]):
        with pytest.raises(SystemExit) as exited:
            run(capsys, *argv)
        assert exited.value.code == 2
    assert api.requests == []


def test_hold_on_someone_of_another_organisation_is_refused(
    api: FakeApi, capsys: pytest.CaptureFixture[str]
) -> None:
    code, _out, err = run(capsys, "hold", "set", "@other/ken")
    assert code == 1 and "not in your organisation" in err
    assert api.requests == []


def test_hold_clear_and_a_hold_that_is_not_there(
    api: FakeApi, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, _err = run(capsys, "hold", "clear", "ken")
    assert code == 0 and "cleared the legal hold on @acme/ken" in out
    api.failure = ApiError(404, ApiErrorCode.NOT_FOUND, "no legal hold on ken")
    code, _out, err = run(capsys, "hold", "clear", "--org")
    assert code == 1 and "no legal hold on the organisation" in err


def test_hold_list(api: FakeApi, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _err = run(capsys, "hold", "list")
    assert code == 0 and out.strip() == "no legal holds"
    api.holds = [
        AuditHold(HoldScope.ORGANISATION, None, 1_767_225_600, "ann"),
        AuditHold(HoldScope.HANDLE, "ken", 1_767_225_600, "bob", "case\x1b[31m 14"),
    ]
    code, out, _err = run(capsys, "hold", "list")
    assert code == 0
    first, second = out.splitlines()
    assert first.startswith("the whole organisation: held since") and "by ann" in first
    assert second.startswith("ken: held since") and "\x1b" not in second
    code, out, _err = run(capsys, "hold", "list", "--json")
    assert [h["handle"] for h in json.loads(out)["holds"]] == [None, "ken"]
