"""Retention on a Clock: the pure decision for a passed-in now, passes over a real SQLite store
in batches with reactor turns between them, legal holds, the relay option and its daily timer."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from twisted.internet import defer
from twisted.internet.task import Clock
from twisted.logger import capturedLogs
from twisted.python import usage

from agentcall import limits
from agentcall.errors import StoreError
from agentcall.relay import audit, tap
from agentcall.relay.audit import AuditEntry
from agentcall.relay.retention import (
    DAY_S,
    EndedInvite,
    HoldKey,
    PruneReport,
    Retention,
    RetentionPolicy,
    keeps_event,
    keeps_invite,
)
from agentcall.relay.store import open_relay_store
from agentcall.relay.store_interface import AuditRow
from tests.unit.relay_helpers import Fired, HeldStore, fired

NOW = 1_800_000_000.0


def at_age(days: float) -> float:
    return NOW - days * DAY_S


def audit_row(days_old: float, *, org: str = "acme", actor: str | None = "ann",
              target: str | None = "bob") -> AuditRow:  # fmt: skip
    return AuditRow(1, at_age(days_old), org, audit.CALL_SUBMIT, actor, target, None, None)


# --- the decision ------------------------------------------------------------------------------


def test_the_cutoff_is_the_retention_period_before_now() -> None:
    assert RetentionPolicy().days == 365
    assert RetentionPolicy().cutoff(NOW) == NOW - 365 * DAY_S
    assert RetentionPolicy(30).cutoff(NOW) == NOW - 30 * DAY_S


@pytest.mark.parametrize("days", [0, -1, limits.AUDIT_RETENTION_MAX_DAYS + 1, True, 1.5])
def test_a_retention_outside_its_bounds_is_refused(days: Any) -> None:
    with pytest.raises(ValueError, match="retention must be"):
        RetentionPolicy(days)


def test_an_event_goes_once_older_than_the_cutoff_unless_a_hold_covers_it() -> None:
    cutoff = RetentionPolicy(365).cutoff(NOW)
    assert keeps_event(audit_row(364.9), cutoff, set())
    assert keeps_event(audit_row(365), cutoff, set())  # exactly the period: kept
    assert not keeps_event(audit_row(365.1), cutoff, set())
    old = audit_row(400)
    assert keeps_event(old, cutoff, {HoldKey("acme")})
    assert keeps_event(old, cutoff, {HoldKey("acme", "ann")})  # its actor
    assert keeps_event(old, cutoff, {HoldKey("acme", "bob")})  # its target
    assert not keeps_event(old, cutoff, {HoldKey("acme", "ken"), HoldKey("beta")})
    assert not keeps_event(old, cutoff, {HoldKey("beta", "ann")})  # another org's ann
    nobody = audit_row(400, actor=None, target=None)
    assert not keeps_event(nobody, cutoff, {HoldKey("acme", "ann")})
    assert keeps_event(nobody, cutoff, {HoldKey("acme")})


def test_an_invite_goes_once_it_ended_before_the_cutoff_unless_a_hold_covers_it() -> None:
    cutoff = RetentionPolicy(30).cutoff(NOW)
    assert keeps_invite(EndedInvite("acme", at_age(29), "ada", None), cutoff, set())
    gone = EndedInvite("acme", at_age(31), "ada", "ken")
    assert not keeps_invite(gone, cutoff, set())
    assert keeps_invite(gone, cutoff, {HoldKey("acme", "ada")})
    assert keeps_invite(gone, cutoff, {HoldKey("acme", "ken")})
    assert keeps_invite(gone, cutoff, {HoldKey("acme")})
    assert not keeps_invite(gone, cutoff, {HoldKey("beta")})


# --- passes --------------------------------------------------------------------------------------


@pytest.fixture
def clock() -> Clock:
    made = Clock()
    made.advance(NOW)
    return made


@pytest.fixture
def store(tmp_path: Path) -> Iterator[Fired]:
    opened = Fired(open_relay_store(tmp_path / "relay.db"))
    opened.ensure_org("acme", at_age(1000))
    opened.ensure_org("beta", at_age(1000))
    yield opened
    opened.close()


def entry(days_old: float, *, org: str = "acme", actor: str | None = "ann",
          target: str | None = "bob", event: str = audit.CALL_SUBMIT) -> AuditEntry:  # fmt: skip
    return AuditEntry(event, org, actor, target, None, at_age(days_old))


def kept(store: Fired, org: str = "acme") -> list[tuple[str, str | None, str | None]]:
    return [(r.event, r.actor, r.detail) for r in store.audit_rows(org, limit=500)]


def test_a_pass_prunes_in_batches_with_a_reactor_turn_between_and_records_it(
    store: Fired, clock: Clock
) -> None:
    store.record_many([entry(400 + i) for i in range(5)] + [entry(10)])
    store.record(entry(500, org=audit.RELAY_WIDE, event=audit.AUTH_FAILED))
    store.record(entry(500, org="beta"))
    retention = Retention(store.wrapped, clock, RetentionPolicy(365), batch=2)
    done = retention.run()
    # Batches of two: the first of acme's went before any reactor turn; the pass waits for one.
    assert not done.called
    assert len(store.audit_rows("acme", limit=500)) == 4
    while not done.called:
        clock.advance(0)
    report = fired(done)
    cutoff = NOW - 365 * DAY_S
    assert report == PruneReport(
        cutoff=cutoff, events={audit.RELAY_WIDE: 1, "acme": 5, "beta": 1}, invites={}
    )
    assert kept(store) == [
        (audit.CALL_SUBMIT, "ann", None),
        (audit.AUDIT_PRUNE, None, f"events=5 invites=0 before={int(cutoff)}"),
    ]
    assert kept(store, "beta") == [
        (audit.AUDIT_PRUNE, None, f"events=1 invites=0 before={int(cutoff)}")
    ]
    # Nothing left to go: a second pass deletes nothing and records nothing.
    again = retention.run()
    assert fired(again) == PruneReport(cutoff=cutoff, events={}, invites={})
    assert len(kept(store)) == 2


def test_the_cutoff_moves_with_the_clock(store: Fired, clock: Clock) -> None:
    store.record(entry(300))
    retention = Retention(store.wrapped, clock, RetentionPolicy(365))
    assert fired(retention.run()).events == {}
    clock.advance(66 * DAY_S)
    assert fired(retention.run()).events == {"acme": 1}


def test_held_rows_and_invites_stay_and_the_rest_goes(store: Fired, clock: Clock) -> None:
    store.record_many(
        [entry(400, actor="ken", target=None), entry(400, actor="ada", target="ken"), entry(400)]
    )
    store.set_hold("acme", "ken", note="case 14", actor="ada", now=at_age(400))
    store.create_invite(
        "acme", created_by="ada", role="member", expires_in_days=1, description=None,
        now=at_age(400),
    )  # fmt: skip
    report = fired(Retention(store.wrapped, clock, RetentionPolicy(365)).run())
    # ann's call and the invite's issue row went, and the expired invite.
    assert report.events == {"acme": 2} and report.invites == {"acme": 1}
    # ken's two rows, the hold's own row (its target is ken), and the pass's row stay.
    assert [(r.event, r.actor) for r in store.audit_rows("acme", limit=500)] == [
        (audit.CALL_SUBMIT, "ken"),
        (audit.CALL_SUBMIT, "ada"),
        (audit.AUDIT_HOLD_SET, "ada"),
        (audit.AUDIT_PRUNE, None),
    ]
    assert store.list_invites("acme", NOW) == []
    # Once the hold is cleared, its rows age out like any other.
    store.clear_hold("acme", "ken", actor="ada", now=NOW)
    assert fired(Retention(store.wrapped, clock, RetentionPolicy(365)).run()).events == {"acme": 3}


def test_a_hold_set_during_a_pass_protects_what_is_left(store: Fired, clock: Clock) -> None:
    store.record_many([entry(400 + i, actor="ken") for i in range(4)])
    done = Retention(store.wrapped, clock, RetentionPolicy(365), batch=2).run()
    assert len(store.audit_rows("acme", limit=500)) == 2
    store.set_hold("acme", None, note=None, actor="ada", now=NOW)
    while not done.called:
        clock.advance(0)
    assert fired(done).events == {"acme": 2}
    assert (
        len([r for r in store.audit_rows("acme", limit=500) if r.event == audit.CALL_SUBMIT]) == 2
    )


def test_a_second_run_while_one_is_going_shares_its_answer(store: Fired, clock: Clock) -> None:
    held = HeldStore(store.wrapped, "retention_orgs")
    retention = Retention(held, clock, RetentionPolicy(365))
    first, second = retention.run(), retention.run()
    assert retention.passes == 1 and len(held.pending) == 1
    held.release()
    assert fired(first) == fired(second)
    third = retention.run()
    held.release()
    fired(third)
    assert retention.passes == 2


def test_a_failed_pass_is_logged_and_the_timer_is_not_stopped(store: Fired, clock: Clock) -> None:
    held = HeldStore(store.wrapped, "prune_audit")
    retention = Retention(held, clock, RetentionPolicy(365))
    with capturedLogs() as logs:
        finished = retention.run_logged()
        held.fail(StoreError("database error: disk I/O error"))
    assert fired(finished) is None
    assert [e.get("event") for e in logs if e.get("log_failure")] == ["retention_failed"]
    failing = retention.run()
    held.fail(StoreError("database error: disk I/O error"))
    with pytest.raises(StoreError):
        fired(failing)


def test_a_successful_pass_logs_what_went(store: Fired, clock: Clock) -> None:
    store.record(entry(400))
    with capturedLogs() as logs:
        fired(Retention(store.wrapped, clock, RetentionPolicy(365)).run_logged())
    (line,) = [e for e in logs if e.get("event") == "retention_pruned"]
    assert (line["events"], line["invites"], line["orgs"], line["days"]) == (1, 0, 1, 365)


def test_a_batch_outside_its_bounds_is_refused(store: Fired, clock: Clock) -> None:
    with pytest.raises(ValueError):
        Retention(store.wrapped, clock, RetentionPolicy(), batch=0)


# --- the relay option and its timer ------------------------------------------------------------


BASE = ["--database", "relay.sqlite", "--url", "http://127.0.0.1:8765"]


def test_the_retention_option_defaults_to_a_year_and_reaches_the_settings() -> None:
    options = tap.Options()
    options.parseOptions(BASE)
    assert tap.settings_from(options).audit_retention_days == 365
    options = tap.Options()
    options.parseOptions([*BASE, "--audit-retention-days", "30"])
    assert tap.settings_from(options).audit_retention_days == 30


@pytest.mark.parametrize("value", ["0", "36501", "a year"])
def test_a_bad_retention_option_is_refused_clearly(value: str) -> None:
    with pytest.raises(usage.UsageError, match="--audit-retention-days must be"):
        tap.Options().parseOptions([*BASE, "--audit-retention-days", value])


def test_the_relay_runs_retention_at_start_and_then_daily(tmp_path: Path) -> None:
    from twisted.application import internet
    from twisted.internet.testing import MemoryReactorClock

    from agentcall.relay.bootstrap import bootstrap

    path = tmp_path / "relay.db"
    bootstrap(path, "acme", "https://relay.example.com/", NOW)
    options = tap.Options()
    options.parseOptions(["--database", str(path), "--url", "http://127.0.0.1:8765"])
    reactor = MemoryReactorClock()
    top: Any = tap.makeService(options, reactor=reactor)
    (timer,) = [
        s
        for s in top
        if isinstance(s, internet.TimerService) and s.call[0].__name__ == "run_logged"
    ]
    assert timer.step == DAY_S
    ran: list[bool] = []

    def run() -> defer.Deferred[None]:
        ran.append(True)
        return defer.succeed(None)

    timer.call = (run, (), {})
    timer.clock = reactor
    timer.startService()
    assert ran == [True]  # at start
    reactor.advance(DAY_S)
    assert ran == [True, True]
    timer.stopService()
