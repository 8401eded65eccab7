"""The switchboard: one live listener session per identity."""

from __future__ import annotations

from twisted.internet.defer import Deferred
from zope.interface.verify import verifyObject

from agentcall.interfaces import IChannel
from agentcall.relay.audit import CALL_SUBMIT, AuditEntry, AuditSink
from agentcall.relay.store_interface import Directory
from agentcall.relay.switchboard import Switchboard
from agentcall.testing.channels import MemoryDirectory, RecordingAudit, RecordingChannel
from agentcall.wire.closecodes import CLOSE_REMOVED, CLOSE_REPLACED


def test_fakes_provide_their_interfaces() -> None:
    """The shipped fakes implement the interfaces the cores are written against (the store's
    protocols are checked by mypy at these assignments, their Deferreds here)."""
    assert verifyObject(IChannel, RecordingChannel())
    directory: Directory = MemoryDirectory()
    sink: AuditSink = RecordingAudit()
    assert isinstance(directory.handle_exists("acme", "ken"), Deferred)
    assert isinstance(sink.record(AuditEntry(CALL_SUBMIT, "acme", "a", "b", None, 0.0)), Deferred)


def test_attach_makes_identity_online() -> None:
    """An attached listener is found by its exact (org, handle) and nothing else."""
    board = Switchboard()
    ken = RecordingChannel("ken")
    board.attach_listener("acme", "ken", ken)
    assert board.listener_for("acme", "ken") is ken
    assert board.is_online("acme", "ken")
    assert not board.is_online("other", "ken")
    assert board.listener_for("acme", "ana") is None
    assert board.count() == 1
    assert not ken.closed


def test_newer_connection_replaces_and_closes_older() -> None:
    """A second session for the same identity closes the first with 4000 and takes over."""
    board = Switchboard()
    old, new = RecordingChannel("old"), RecordingChannel("new")
    board.attach_listener("acme", "ken", old)
    board.attach_listener("acme", "ken", new)
    assert old.closes == [(CLOSE_REPLACED, "replaced by a newer connection")]
    assert CLOSE_REPLACED == 4000
    assert not new.closed
    assert board.listener_for("acme", "ken") is new
    assert board.count() == 1


def test_late_detach_of_replaced_session_keeps_new_one() -> None:
    """The old socket's teardown, arriving after replacement, does not unplug the new one."""
    board = Switchboard()
    old, new = RecordingChannel("old"), RecordingChannel("new")
    board.attach_listener("acme", "ken", old)
    board.attach_listener("acme", "ken", new)
    assert board.detach_listener("acme", "ken", old) is False
    assert board.listener_for("acme", "ken") is new
    assert board.detach_listener("acme", "ken", new) is True
    assert not board.is_online("acme", "ken")
    assert board.count() == 0


def test_detach_during_replacement_close_keeps_new_one() -> None:
    """A close that tears the old session down synchronously already sees the new one."""
    board = Switchboard()
    new = RecordingChannel("new")

    class DetachOnClose(RecordingChannel):
        def close(self, code: int, reason: str) -> None:
            super().close(code, reason)
            board.detach_listener("acme", "ken", self)

    old = DetachOnClose("old")
    board.attach_listener("acme", "ken", old)
    board.attach_listener("acme", "ken", new)
    assert old.closed
    assert board.listener_for("acme", "ken") is new


def test_reattaching_same_channel_does_not_close_it() -> None:
    """Attaching the current session again is a no-op, not a self-replacement."""
    board = Switchboard()
    ken = RecordingChannel("ken")
    board.attach_listener("acme", "ken", ken)
    board.attach_listener("acme", "ken", ken)
    assert not ken.closed
    assert board.listener_for("acme", "ken") is ken


def test_identities_are_independent() -> None:
    """Same handle in two orgs, or two handles in one org, are separate sessions."""
    board = Switchboard()
    a, b, c = RecordingChannel("a"), RecordingChannel("b"), RecordingChannel("c")
    board.attach_listener("acme", "ken", a)
    board.attach_listener("other", "ken", b)
    board.attach_listener("acme", "ana", c)
    assert not (a.closed or b.closed or c.closed)
    assert board.count() == 3
    assert board.detach_listener("other", "ken", a) is False
    assert board.listener_for("acme", "ken") is a


def test_closing_a_member_closes_their_listener_and_every_caller_socket_only() -> None:
    board = Switchboard()
    listener, call_a, call_b = RecordingChannel("l"), RecordingChannel("a"), RecordingChannel("b")
    other = RecordingChannel("other")
    board.attach_listener("acme", "ken", listener)
    board.attach_caller("acme", "ken", call_a)
    board.attach_caller("acme", "ken", call_b)
    board.attach_caller("acme", "ann", other)
    board.attach_caller("beta", "ken", other)
    board.detach_caller("acme", "ken", call_b)  # that one already went away
    board.detach_caller("acme", "nobody", call_b)  # harmless

    assert board.close_member("acme", "ken", CLOSE_REMOVED, "removed") == 2

    assert listener.closes == call_a.closes == [(CLOSE_REMOVED, "removed")]
    assert not call_b.closed and not other.closed
    assert board.close_member("acme", "nobody", CLOSE_REMOVED, "removed") == 0
