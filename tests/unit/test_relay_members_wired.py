"""Removing a member through the relay's HTTP API while their sockets are open (memory
transports, the whole composed relay): every socket closes, calls end, jobs end revoked."""

from __future__ import annotations

import json

from agentcall.errors import CallErrorCode
from agentcall.wire.closecodes import CLOSE_CREDENTIALS_CHANGED, CLOSE_REMOVED
from agentcall.wire.frames import CallError, CallQueued, CallRequest, CallStatus, CancelCall
from agentcall.wire.http import MemberRole
from tests.unit.relay_helpers import fired
from tests.unit.test_relay_protocol import REQUEST, Switch, switch

__all__ = ["switch"]  # the fixture, imported for the tests below


def remove(s: Switch, handle: str, admin_token: str, *, release: bool = False) -> dict[str, object]:
    body = json.dumps({"release": release}).encode()
    answer = s.relay.request(
        "POST", f"/v1/members/{handle}/remove", body=body, token=admin_token, handle="ada"
    )
    assert answer.status == 200, answer.body
    parsed: dict[str, object] = answer.json()
    return parsed


def test_removing_the_callee_mid_call_closes_its_socket_and_ends_the_call(switch: Switch) -> None:
    ada = switch.relay.enrol("ada", MemberRole.ADMIN)
    ken = switch.connect("role=listen", "ken")
    ann = switch.connect("role=call&to=ken", "ann")
    ann.send(REQUEST)
    switch.flush()
    assert isinstance(ann.frames[-1], CallStatus)  # ringing at Ken's

    removed = remove(switch, "ken", ada)
    switch.flush()

    assert (removed["handle"], removed["status"], removed["removed_by"]) == (
        "ken",
        "removed",
        "ada",
    )
    assert ken.close_code == CLOSE_REMOVED
    assert not switch.relay.relay.switchboard.is_online("acme", "ken")
    # The caller hears that the call is over instead of waiting for its deadline.
    error = ann.frames[-1]
    assert isinstance(error, CallError) and error.code is CallErrorCode.REVOKED
    assert switch.relay.relay.calls.active_count() == 0
    # Ken's token no longer opens a socket, and a new call to Ken is to nobody.
    again = switch.connect("role=listen", "ken")
    assert again.frames == [] and not switch.relay.relay.switchboard.is_online("acme", "ken")
    bob = switch.connect("role=call&to=ken", "ann")
    bob.send(REQUEST)
    switch.flush()
    [refused] = [f for f in bob.frames if isinstance(f, CallError)]
    assert refused.code is CallErrorCode.UNKNOWN_HANDLE


def test_removing_a_caller_closes_its_caller_sockets(switch: Switch) -> None:
    ada = switch.relay.enrol("ada", MemberRole.ADMIN)
    ken = switch.connect("role=listen", "ken")
    ann = switch.connect("role=call&to=ken", "ann")
    idle = switch.connect("role=call&to=ken", "ann")  # connected, no call asked for yet
    ann.send(REQUEST)
    switch.flush()
    [ringing] = [f for f in ann.frames if isinstance(f, CallStatus)]
    remove(switch, "ann", ada)
    switch.flush()
    # The call ends revoked (its socket closes with it); the other socket is closed as removed.
    error = ann.frames[-1]
    assert isinstance(error, CallError) and error.code is CallErrorCode.REVOKED
    assert ann.close_code is not None and idle.close_code == CLOSE_REMOVED
    # Ken's agent is told to stop working for someone who is gone.
    assert ken.frames[-1] == CancelCall(call_id=ringing.call_id)
    assert ken.close_code is None
    assert switch.relay.relay.calls.active_count() == 0
    assert switch.relay.relay.door.gate.callers_of("@acme/ann") == 0


def test_members_are_listed_with_last_seen_before_it_is_written(switch: Switch) -> None:
    ada = switch.relay.enrol("ada", MemberRole.ADMIN)
    switch.relay.reactor.advance(30)
    switch.connect("role=listen", "ken")
    seen_at = int(switch.relay.reactor.seconds())
    listed = switch.relay.request("GET", "/v1/members", token=ada, handle="ada").json()
    by_handle = {m["handle"]: m for m in listed["members"]}
    assert sorted(by_handle) == ["ada", "ann", "ken"] and listed["next_after"] is None
    assert by_handle["ken"]["last_seen"] == seen_at
    assert "last_seen" not in by_handle["ann"] or by_handle["ann"]["last_seen"] is None
    # Written once flushed; the list reads the same from the store alone.
    switch.relay.relay.seen.flush()
    rows = fired(switch.relay.store.list_members("acme", limit=10))
    assert {m.handle: m.last_seen for m in rows}["ken"] == seen_at


def test_member_routes_are_for_admins_only(switch: Switch) -> None:
    ann = switch.tokens["ann"]
    for method, path, body in (
        ("GET", "/v1/members", None),
        ("POST", "/v1/members/ken/remove", b"{}"),
        ("PUT", "/v1/members/ken/role", b'{"role": "admin"}'),
    ):
        answer = switch.relay.request(method, path, body=body, token=ann, handle="ann")
        assert (answer.status, answer.json()["error"]) == (403, "forbidden")
    assert fired(switch.relay.store.handle_exists("acme", "ken"))  # nothing was removed


def test_an_admin_changes_a_role_and_bad_bodies_are_refused(switch: Switch) -> None:
    ada = switch.relay.enrol("ada", MemberRole.ADMIN)
    made = switch.relay.request(
        "PUT", "/v1/members/ken/role", body=b'{"role": "admin"}', token=ada, handle="ada"
    )
    assert (made.status, made.json()["role"]) == (200, "admin")
    for body in (b'{"role": "owner"}', b"{}", b"[]", b'{"role": "admin", "x": 1}'):
        bad = switch.relay.request(
            "PUT", "/v1/members/ken/role", body=body, token=ada, handle="ada"
        )
        assert bad.status == 400, body
    stepping_down = switch.relay.request(
        "PUT", "/v1/members/ada/role", body=b'{"role": "member"}', token=ada, handle="ada"
    )
    assert stepping_down.status == 200  # Ken is an admin now
    last = switch.relay.request(
        "PUT", "/v1/members/ken/role", body=b'{"role": "member"}', token=ada, handle="ada"
    )
    assert last.status == 403  # Ada is no longer an admin herself


def test_a_removed_callees_queued_jobs_end_revoked_and_the_handle_waits_for_them(
    switch: Switch,
) -> None:
    ada = switch.relay.enrol("ada", MemberRole.ADMIN)
    ken = switch.tokens["ken"]
    put = switch.relay.request(
        "PUT", "/v1/me/offline-delivery", body=b'{"enabled": true}', token=ken, handle="ken"
    )
    assert put.status == 200
    ann = switch.connect("role=call&to=ken", "ann")
    ann.send(CallRequest(envelope=REQUEST.envelope, correlation_id="c0ffee" + "0" * 26, queue=True))
    switch.flush()
    [queued] = [f for f in ann.frames if isinstance(f, CallQueued)]

    remove(switch, "ken", ada)

    stored = fired(switch.relay.store.get_job(queued.job_id))
    assert stored is not None
    assert (stored.job.state.value, str(stored.job.reason)) == ("failed", "revoked")
    seen_by_ann = switch.relay.request(
        "GET", f"/v1/jobs/{queued.job_id}", token=switch.tokens["ann"], handle="ann"
    ).json()
    assert (seen_by_ann["state"], seen_by_ann["reason"]) == ("failed", "revoked")
    # The mailbox still shows Ann that job, so the handle is not handed to someone else yet.
    body = json.dumps({"release": True}).encode()
    busy = switch.relay.request(
        "POST", "/v1/members/ken/remove", body=body, token=ada, handle="ada"
    )
    assert (busy.status, busy.json()["error"]) == (409, "handle_busy")


def test_rotating_a_token_closes_the_members_sockets_and_only_the_new_one_works(
    switch: Switch,
) -> None:
    ken_token = switch.tokens["ken"]
    ken = switch.connect("role=listen", "ken")
    other = switch.connect("role=listen", "ann")
    new = "N" * 43
    rotated = switch.relay.request(
        "POST", "/v1/me/token", body=json.dumps({"token": new}).encode(), token=ken_token,
        handle="ken",
    )  # fmt: skip
    switch.flush()
    assert rotated.status == 200 and "rotated_at" in rotated.json()
    assert new not in rotated.body.decode()  # the answer never echoes a token
    assert ken.close_code == CLOSE_CREDENTIALS_CHANGED and other.close_code is None
    old = switch.relay.request("GET", "/v1/me", token=ken_token, handle="ken")
    assert old.status == 401
    assert switch.relay.request("GET", "/v1/me", token=new, handle="ken").status == 200
    again = switch.connect("role=listen", "ken", token=new)
    assert again.frames and switch.relay.relay.switchboard.is_online("acme", "ken")
    bad = switch.relay.request(
        "POST", "/v1/me/token", body=b'{"token": "short"}', token=new, handle="ken"
    )
    assert bad.status == 400
