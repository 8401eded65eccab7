"""The relay as a process: enrolment, keys, and sealed calls routed between real clients."""

from __future__ import annotations

from pathlib import Path

import pytest
import pytest_twisted

from agentcall.errors import ApiError, ApiErrorCode, CallErrorCode
from agentcall.wire import frames, http, payloads
from tests.e2e.parties import Party, echo, enrol, invite
from tests.e2e.processes import RelayProcess, start_relay

pytestmark = pytest.mark.e2e

Relay = tuple[RelayProcess, dict[str, str]]


async def _pair(relay: Relay, a: str, b: str) -> tuple[Party, Party]:
    process, invites = relay
    admin = await enrol(process.url, process.ca_file, invites["acme"], a)
    member = await enrol(process.url, process.ca_file, await invite(admin), b)
    await admin.publish_keys()
    await member.publish_keys()
    invites["acme"] = await invite(admin, http.MemberRole.ADMIN)  # for the next test
    return admin, member


@pytest_twisted.ensureDeferred
async def test_a_call_is_routed_both_ways_and_each_outcome_opens(relay: Relay) -> None:
    """ann calls ken and ken calls ann; each sealed answer reaches its caller and opens."""
    ann, ken = await _pair(relay, "ann", "ken")
    ann.answer = ken.answer = echo
    await ann.listen()
    await ken.listen()

    sealed, request = await ann.seal_to(ken, "why did CI fail?")
    terminal, statuses = await ann.call("ken", sealed)
    assert isinstance(terminal, frames.CallOutcome)
    assert terminal.terminal is frames.Terminal.COMPLETED
    assert [s.state for s in statuses] == ["ringing", "answered", "working"]
    response = ann.open_outcome(terminal, request, ken)
    assert response.outcome == payloads.Reply(text="echo from @acme/ken: why did CI fail?")

    sealed, request = await ken.seal_to(ann, "and the other way?")
    terminal, _ = await ken.call("ann", sealed)
    assert isinstance(terminal, frames.CallOutcome)
    assert ken.open_outcome(terminal, request, ann).outcome == payloads.Reply(
        text="echo from @acme/ann: and the other way?"
    )
    # The listener saw the relay-verified caller handle, never anyone else's call.
    incoming = [f for f in ken.received if isinstance(f, frames.IncomingCall)]
    assert [f.from_ for f in incoming] == ["ann"]


@pytest_twisted.ensureDeferred
async def test_relay_errors_come_from_real_requests(relay: Relay) -> None:
    """offline, unknown_handle, unauthorized, protocol_error: each produced by a real call."""
    bob, eve = await _pair(relay, "bob", "eve")
    sealed, _ = await bob.seal_to(eve, "hello")

    terminal, _ = await bob.call("eve", sealed)  # eve has no listener
    assert code_of(terminal) is CallErrorCode.OFFLINE

    terminal, _ = await bob.call("nobody-here", sealed)
    assert code_of(terminal) is CallErrorCode.UNKNOWN_HANDLE

    eve.answer = echo
    await eve.listen()
    # Sealed to eve but sent down a socket aimed at bob himself: the route does not match.
    await bob.listen()
    terminal, _ = await bob.call("bob", sealed)
    assert code_of(terminal) is CallErrorCode.PROTOCOL_ERROR

    forged = Party(
        relay_url=bob.relay_url,
        ca_file=bob.ca_file,
        registration=attrs_evolve_token(bob.registration, "A" * 43),
    )
    terminal, _ = await forged.call("eve", sealed)
    assert code_of(terminal) is CallErrorCode.UNAUTHORIZED


@pytest_twisted.ensureDeferred
async def test_forged_from_and_cross_org_to_are_refused(relay: Relay) -> None:
    """A caller cannot claim another sender, nor reach into another organisation."""
    process, invites = relay
    cat, dan = await _pair(relay, "cat", "dan")
    dan.answer = echo
    await dan.listen()
    outsider = await enrol(process.url, process.ca_file, invites["other"], "dan")
    await outsider.publish_keys()
    outsider.answer = echo
    await outsider.listen()

    forged, _ = await cat.seal_to(dan, "hi", sender_address="@acme/ann")
    terminal, _ = await cat.call("dan", forged)
    assert code_of(terminal) is CallErrorCode.PROTOCOL_ERROR

    # Sealed to @other/dan: the relay resolves `dan` inside cat's own org, so the route fails.
    cross, _ = await cat.seal_to(await outsider.keys_of("dan"), "hi")
    terminal, _ = await cat.call("dan", cross)
    assert code_of(terminal) is CallErrorCode.PROTOCOL_ERROR
    assert not [f for f in outsider.received if isinstance(f, frames.IncomingCall)]
    assert not [f for f in dan.received if isinstance(f, frames.IncomingCall)]

    # Keys of another organisation's identity are not served either.
    with pytest.raises(ApiError) as info:
        await cat.keys_of("nobody")
    assert info.value.code is ApiErrorCode.NOT_FOUND


@pytest_twisted.ensureDeferred
async def test_a_newer_listener_replaces_the_older(relay: Relay) -> None:
    """A second listener session for the same identity closes the first with 4000."""
    fay, gil = await _pair(relay, "fay", "gil")
    first = await gil.listen()
    closed = gil.next_close()
    gil.answer = echo
    await gil.listen()
    info = await closed
    assert info.code == 4000
    assert not first.is_open
    sealed, _ = await fay.seal_to(gil, "still there?")
    terminal, _ = await fay.call("gil", sealed)
    assert isinstance(terminal, frames.CallOutcome)


def code_of(terminal: frames.CallOutcome | frames.CallError) -> CallErrorCode | None:
    return terminal.code if isinstance(terminal, frames.CallError) else None


def attrs_evolve_token(reg: http.RegisterResponse, token: str) -> http.RegisterResponse:
    import attrs

    return attrs.evolve(reg, token=token)


@pytest_twisted.ensureDeferred
async def test_deadline_and_rate_limit(tmp_path: Path) -> None:
    """A short configured deadline gives `timeout`; the per-pair budget gives `rate_limited`."""
    process, invites = start_relay(
        tmp_path, extra_args=("--call-deadline", "1", "--calls-per-hour", "2")
    )
    try:
        relay = (process, invites)
        hal, ivy = await _pair(relay, "hal", "ivy")
        await ivy.listen()  # never answers
        sealed, _ = await hal.seal_to(ivy, "are you there?")
        terminal, statuses = await hal.call("ivy", sealed)
        assert code_of(terminal) is CallErrorCode.TIMEOUT
        assert [s.state for s in statuses] == ["ringing"]
        assert any(isinstance(f, frames.CancelCall) for f in ivy.received)

        terminal, _ = await hal.call("ivy", sealed)
        assert code_of(terminal) is CallErrorCode.TIMEOUT
        terminal, _ = await hal.call("ivy", sealed)
        assert code_of(terminal) is CallErrorCode.RATE_LIMITED
    finally:
        process.stop()
