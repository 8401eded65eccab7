"""The audit routes through a real Site on memory transports: the streamed export (paged, paced
by the transport, cut short on a store failure), legal holds, and presence of others refused
and recorded."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from twisted.internet.error import ConnectionDone
from twisted.python.failure import Failure

from agentcall import limits
from agentcall.errors import StoreError
from agentcall.relay import audit
from agentcall.relay.audit import AuditEntry
from agentcall.wire import codec
from agentcall.wire.http import AuditEvent, AuditExportEnd, MemberRole
from tests.unit.crypto_helpers import NOW
from tests.unit.relay_helpers import (
    HeldStore,
    MemoryRelay,
    fired,
    holding,
    memory_relay,
    parse_answer,
    raw_request,
)


@pytest.fixture
def relay(tmp_path: Path) -> MemoryRelay:
    return memory_relay(tmp_path, now=NOW)


def dechunk(body: bytes) -> tuple[bytes, bool]:
    """The payload of a chunked body, and whether its last (empty) chunk came."""
    out = b""
    while body:
        size_line, _, rest = body.partition(b"\r\n")
        size = int(size_line, 16)
        if size == 0:
            return out, True
        out, body = out + rest[:size], rest[size + 2 :]
    return out, False


def lines(payload: bytes) -> list[Any]:
    return [json.loads(line) for line in payload.split(b"\n") if line]


def seed(relay: MemoryRelay, count: int, *, start: float = NOW - 1000.0) -> None:
    fired(
        relay.store.record_many(
            [
                AuditEntry(audit.CALL_SUBMIT, "acme", "ann", "ken", None, start + i)
                for i in range(count)
            ]
        )
    )


def presence_rows(relay: MemoryRelay) -> list[tuple[str | None, str | None]]:
    relay.reactor.advance(limits.AUDIT_WINDOW_S)  # the audit sink writes its rows in windows
    rows = fired(relay.store.audit_rows("acme", limit=500))
    return [(r.actor, r.target) for r in rows if r.event == audit.PRESENCE_REFUSED]


# --- presence ----------------------------------------------------------------------------------


def test_ones_own_presence_is_answered_by_any_spelling(relay: MemoryRelay) -> None:
    ann = relay.enrol("ann")
    for path in ("/v1/presence", "/v1/presence?handle=ann", "/v1/presence/@acme%2Fann"):
        answer = relay.request("GET", path, token=ann, handle="ann")
        assert answer.status == 200, path
        assert answer.json() == {"address": "@acme/ann", "online": False}
    assert presence_rows(relay) == []


@pytest.mark.parametrize(
    ("path", "target"),
    [
        ("/v1/presence?handle=ken", "ken"),
        ("/v1/presence?address=@acme/ken", "ken"),
        ("/v1/presence/ken", "ken"),
        ("/v1/presence/@acme/ken", "ken"),
        ("/v1/presence?handle=nobody", "nobody"),
        ("/v1/presence?address=@other/ken", "@other/ken"),
    ],
)
def test_asking_about_anyone_else_is_refused_alike_and_recorded(
    relay: MemoryRelay, path: str, target: str
) -> None:
    ann = relay.enrol("ann")
    relay.enrol("ken")
    answer = relay.request("GET", path, token=ann, handle="ann")
    assert (answer.status, answer.json()["error"]) == (403, "forbidden")
    assert "presence is private" in answer.json()["message"]
    assert presence_rows(relay) == [("ann", target)]


def test_a_flood_of_presence_asks_is_written_in_one_transaction(relay: MemoryRelay) -> None:
    ann = relay.enrol("ann")
    sink = relay.relay.audit
    before = sink.batches
    for n in range(50):
        relay.request("GET", f"/v1/presence?handle=ken{n}", token=ann, handle="ann")
    assert len(presence_rows(relay)) == 50
    assert sink.batches == before + 1


def test_a_refusal_says_nothing_of_whether_someone_exists_or_is_online(relay: MemoryRelay) -> None:
    ann = relay.enrol("ann")
    relay.enrol("ken")
    known = relay.request("GET", "/v1/presence?handle=ken", token=ann, handle="ann")
    unknown = relay.request("GET", "/v1/presence?handle=kim", token=ann, handle="ann")
    assert (known.status, known.body) == (unknown.status, unknown.body)


def test_naming_nobody_valid_is_400_and_records_nothing(relay: MemoryRelay) -> None:
    ann = relay.enrol("ann")
    answer = relay.request("GET", "/v1/presence?handle=KEN", token=ann, handle="ann")
    assert (answer.status, answer.json()["error"]) == (400, "bad_request")
    assert presence_rows(relay) == []


# --- the export ----------------------------------------------------------------------------------


def export(relay: MemoryRelay, token: str, query: str = "") -> tuple[int, dict[str, str], bytes]:
    """Ask for an export and let the reactor run until the relay is done writing it."""
    protocol, transport = relay.connect()
    raw = raw_request("GET", "/v1/audit/export" + query, token=token, handle="ada")
    protocol.dataReceived(raw)
    for _ in range(10_000):
        if transport.disconnecting:
            break
        relay.reactor.advance(0)
    protocol.connectionLost(Failure(ConnectionDone()))
    answer = parse_answer(transport.value())
    return answer.status, answer.headers, answer.body


def test_an_admin_exports_every_row_then_an_end_line(relay: MemoryRelay) -> None:
    ada = relay.enrol("ada", MemberRole.ADMIN)
    seed(relay, 1_203)
    status, headers, body = export(relay, ada)
    assert status == 200
    assert headers["content-type"] == "application/x-ndjson"
    assert headers["transfer-encoding"] == "chunked"
    payload, whole = dechunk(body)
    assert whole
    got = lines(payload)
    events = [codec.converter.structure(line, AuditEvent) for line in got[:-1]]
    assert codec.converter.structure(got[-1], AuditExportEnd).events == len(events)
    # The enrolment rows, the seeded rows and the export's own row, in id order.
    assert [e.event for e in events[-1_204:]] == [audit.CALL_SUBMIT] * 1_203 + [audit.AUDIT_EXPORT]
    assert [e.id for e in events] == sorted(e.id for e in events)
    assert events[-1].actor == "ada" and events[-1].detail == "since=start until=now"
    assert events[-2].at_ms == int((NOW - 1000.0 + 1202) * 1000)


def test_the_export_takes_a_window(relay: MemoryRelay) -> None:
    ada = relay.enrol("ada", MemberRole.ADMIN)
    seed(relay, 10, start=1_000_000.0)
    _status, _headers, body = export(relay, ada, "?since=1000002&until=1000005")
    got = lines(dechunk(body)[0])
    assert [line["at_ms"] for line in got[:-1]] == [1_000_002_000, 1_000_003_000, 1_000_004_000]
    assert got[-1] == {"complete": True, "events": 3}
    # The export's own row names the window (and falls outside it).
    rows = fired(relay.store.audit_rows("acme", limit=500))
    assert rows[-1].event == audit.AUDIT_EXPORT
    assert rows[-1].detail == "since=1000002 until=1000005"


def test_a_bad_window_is_400_before_anything_streams(relay: MemoryRelay) -> None:
    ada = relay.enrol("ada", MemberRole.ADMIN)
    answer = relay.request("GET", "/v1/audit/export?since=5&until=5", token=ada, handle="ada")
    assert (answer.status, answer.json()["error"]) == (400, "bad_request")


def test_a_member_may_not_export(relay: MemoryRelay) -> None:
    ann = relay.enrol("ann")
    answer = relay.request("GET", "/v1/audit/export", token=ann, handle="ann")
    assert (answer.status, answer.json()["error"]) == (403, "forbidden")


def test_the_export_writes_a_page_a_turn_and_waits_while_paused(relay: MemoryRelay) -> None:
    """Memory is one page: the next is read only on a later turn, and not at all while the
    transport is full, however many rows there are."""
    ada = relay.enrol("ada", MemberRole.ADMIN)
    seed(relay, limits.AUDIT_EXPORT_PAGE * 4)
    protocol, transport = relay.connect()
    protocol.dataReceived(raw_request("GET", "/v1/audit/export", token=ada, handle="ada"))
    page = limits.AUDIT_EXPORT_PAGE
    assert transport.value().count(b"\n{") + 1 >= page  # the first page went at once
    first = len(transport.value())
    relay.reactor.advance(0)
    second = len(transport.value())
    assert second > first
    # The transport is full (it tells the HTTP channel, which tells the export): nothing more
    # is read until it asks again.
    producer = protocol.wrappedProtocol
    producer.pauseProducing()
    relay.reactor.advance(0)
    relay.reactor.advance(0)
    assert len(transport.value()) == second
    producer.resumeProducing()
    for _ in range(10):
        relay.reactor.advance(0)
    assert transport.disconnecting
    payload, whole = dechunk(parse_answer(transport.value()).body)
    # Three rows of ada's enrolment, the seeded ones, the export's own.
    assert whole and lines(payload)[-1]["events"] == page * 4 + 4


def test_rows_written_during_an_export_are_not_in_it(relay: MemoryRelay) -> None:
    ada = relay.enrol("ada", MemberRole.ADMIN)
    seed(relay, limits.AUDIT_EXPORT_PAGE * 2)
    protocol, transport = relay.connect()
    protocol.dataReceived(raw_request("GET", "/v1/audit/export", token=ada, handle="ada"))
    seed(relay, 5, start=NOW)
    for _ in range(10):
        relay.reactor.advance(0)
    got = lines(dechunk(parse_answer(transport.value()).body)[0])
    assert got[-1]["events"] == limits.AUDIT_EXPORT_PAGE * 2 + 4


def test_a_store_failure_half_way_cuts_the_export_short(tmp_path: Path) -> None:
    relay = memory_relay(tmp_path, now=NOW, wrap=holding("audit_rows"))
    ada = relay.enrol("ada", MemberRole.ADMIN)
    seed(relay, limits.AUDIT_EXPORT_PAGE * 2)
    held = relay.relay.jobs._store  # the same HeldStore every part of the relay was given
    assert isinstance(held, HeldStore)
    protocol, transport = relay.connect()
    protocol.dataReceived(raw_request("GET", "/v1/audit/export", token=ada, handle="ada"))
    held.release()  # the first page
    relay.reactor.advance(0)
    held.fail(StoreError("database error: disk I/O error"))
    assert transport.disconnected or transport.disconnecting
    payload, whole = dechunk(parse_answer(transport.value()).body)
    assert not whole
    assert all("complete" not in line for line in lines(payload))
    assert len(lines(payload)) == limits.AUDIT_EXPORT_PAGE


def test_a_row_that_is_no_valid_line_cuts_the_export_short(relay: MemoryRelay) -> None:
    ada = relay.enrol("ada", MemberRole.ADMIN)
    seed(relay, limits.AUDIT_EXPORT_PAGE)
    relay.store.registry._conn.execute(
        "INSERT INTO audit (at, org, event) VALUES (?, 'acme', 'Not An Event')", (NOW,)
    )
    status, _headers, body = export(relay, ada)
    payload, whole = dechunk(body)
    assert status == 200 and not whole
    assert len(lines(payload)) == limits.AUDIT_EXPORT_PAGE  # the first page, then the cut


def test_a_client_gone_mid_export_stops_the_reading(tmp_path: Path) -> None:
    relay = memory_relay(tmp_path, now=NOW, wrap=holding("audit_rows"))
    ada = relay.enrol("ada", MemberRole.ADMIN)
    seed(relay, limits.AUDIT_EXPORT_PAGE * 3)
    held = relay.relay.jobs._store
    assert isinstance(held, HeldStore)
    protocol, _transport = relay.connect()
    protocol.dataReceived(raw_request("GET", "/v1/audit/export", token=ada, handle="ada"))
    held.release()
    protocol.connectionLost(Failure(ConnectionDone()))
    for _ in range(5):
        relay.reactor.advance(0)
    assert held.pending == []  # no page asked for after the client went


# --- holds ---------------------------------------------------------------------------------------


def test_an_admin_sets_lists_and_clears_holds(relay: MemoryRelay) -> None:
    ada = relay.enrol("ada", MemberRole.ADMIN)
    put = relay.request(
        "PUT", "/v1/audit/holds", body=b'{"handle": "ken", "note": "case 14"}', token=ada,
        handle="ada",
    )  # fmt: skip
    assert put.status == 200
    assert put.json() == {
        "scope": "handle", "handle": "ken", "set_at": int(NOW), "set_by": "ada", "note": "case 14"
    }  # fmt: skip
    org = relay.request("PUT", "/v1/audit/holds", body=b"{}", token=ada, handle="ada")
    assert org.json()["scope"] == "organisation" and org.json()["handle"] is None
    listed = relay.request("GET", "/v1/audit/holds", token=ada, handle="ada")
    assert [h["scope"] for h in listed.json()["holds"]] == ["organisation", "handle"]
    cleared = relay.request(
        "POST", "/v1/audit/holds/clear", body=b'{"handle": "ken"}', token=ada, handle="ada"
    )
    assert cleared.status == 200 and cleared.json()["handle"] == "ken"
    again = relay.request(
        "POST", "/v1/audit/holds/clear", body=b'{"handle": "ken"}', token=ada, handle="ada"
    )
    assert (again.status, again.json()["error"]) == (404, "not_found")
    noted = relay.request(
        "POST", "/v1/audit/holds/clear", body=b'{"note": "x"}', token=ada, handle="ada"
    )
    assert (noted.status, noted.json()["error"]) == (400, "bad_request")
    rows = fired(relay.store.audit_rows("acme", limit=500))
    assert [(r.event, r.target) for r in rows if r.event.startswith("audit.hold")] == [
        (audit.AUDIT_HOLD_SET, "ken"),
        (audit.AUDIT_HOLD_SET, None),
        (audit.AUDIT_HOLD_CLEAR, "ken"),
    ]


@pytest.mark.parametrize(
    ("method", "path", "body"),
    [
        ("GET", "/v1/audit/holds", None),
        ("PUT", "/v1/audit/holds", b"{}"),
        ("POST", "/v1/audit/holds/clear", b"{}"),
    ],
)
def test_holds_are_for_admins_only(
    relay: MemoryRelay, method: str, path: str, body: bytes | None
) -> None:
    ann = relay.enrol("ann")
    answer = relay.request(method, path, body=body, token=ann, handle="ann")
    assert (answer.status, answer.json()["error"]) == (403, "forbidden")
