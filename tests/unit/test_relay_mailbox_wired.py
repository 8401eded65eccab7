"""The offline mailbox through a composed relay: the HTTP routes, the listener socket with
``mailbox=1``, no plaintext in the database, and the relay's options."""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import txaio as _txaio
from twisted.internet.error import ConnectionDone
from twisted.python import usage
from twisted.python.failure import Failure

from agentcall import limits
from agentcall.crypto import envelope as crypto_envelope
from agentcall.errors import CallErrorCode
from agentcall.relay import tap
from agentcall.relay.jobs import queue_refusal
from agentcall.relay.mailbox import MailboxLimits, Refusal
from agentcall.wire import codec
from agentcall.wire.frames import (
    CallError,
    CallQueued,
    CallRequest,
    CancelJob,
    Direction,
    JobAccepted,
    JobAck,
    JobDelivery,
    JobResult,
    JobsHeld,
    Ready,
    SealedEnvelope,
    Terminal,
)
from agentcall.wire.payloads import Reply
from tests.unit.crypto_helpers import NOW, make_party
from tests.unit.relay_helpers import (
    MemoryRelay,
    fired,
    memory_relay,
    parse_answer,
    raw_request,
    sealed_looking,
)
from tests.unit.test_relay_protocol import Switch, relay_switch

txaio: Any = _txaio
CORRELATION = "c0ffee" + "0" * 26


@pytest.fixture
def switch(tmp_path: Path) -> Iterator[Switch]:
    with relay_switch(tmp_path) as switched:
        yield switched


def api(switch: Switch, method: str, path: str, handle: str, body: object = None) -> Any:
    data = None if body is None else json.dumps(body).encode()
    return switch.relay.request(method, path, body=data, token=switch.tokens[handle], handle=handle)


def queue_one(switch: Switch, request: CallRequest | None = None) -> str:
    """ann calls ken, who is offline and opted in; the job id."""
    if request is None:
        request = CallRequest(envelope=sealed_request(), correlation_id=CORRELATION, queue=True)
    ann = switch.connect("role=call&to=ken", "ann")
    ann.send(request)
    switch.flush()
    (queued,) = ann.frames[1:]
    assert isinstance(queued, CallQueued), queued
    return queued.job_id


def stored_state(switch: Switch, job_id: str) -> str:
    stored = fired(switch.relay.store.get_job(job_id))
    assert stored is not None
    return stored.job.state.value


def sealed_request() -> SealedEnvelope:
    return sealed_looking(Direction.REQUEST, "@acme/ann", "@acme/ken")


# --- HTTP ---------------------------------------------------------------------------------------


def test_the_opt_in_is_off_by_default_set_by_put_and_shown_in_me(switch: Switch) -> None:
    assert api(switch, "GET", "/v1/me", "ken").json()["offline_delivery"] is False
    put = api(switch, "PUT", "/v1/me/offline-delivery", "ken", {"enabled": True})
    assert (put.status, put.json()) == (200, {"enabled": True})
    assert api(switch, "GET", "/v1/me", "ken").json()["offline_delivery"] is True
    assert api(switch, "GET", "/v1/me", "ann").json()["offline_delivery"] is False
    bad = api(switch, "PUT", "/v1/me/offline-delivery", "ken", {"enabled": "yes"})
    assert (bad.status, bad.json()["error"]) == (400, "bad_request")


def test_jobs_are_listed_fetched_and_cancelled_over_http(switch: Switch) -> None:
    api(switch, "PUT", "/v1/me/offline-delivery", "ken", {"enabled": True})
    job_id = queue_one(switch)
    (sent,) = api(switch, "GET", "/v1/jobs", "ann").json()["jobs"]
    (received,) = api(switch, "GET", "/v1/jobs", "ken").json()["jobs"]
    assert (sent["side"], received["side"], sent["state"]) == ("sent", "received", "queued")
    assert sent["caller"] == "@acme/ann" and sent["callee"] == "@acme/ken"
    got = api(switch, "GET", f"/v1/jobs/{job_id}?wait=0", "ann")
    assert (got.status, got.json()["state"]) == (200, "queued")
    # The callee may not cancel; to them the job is not found, as to anyone else.
    for handle, path in (("ken", f"/v1/jobs/{job_id}/cancel"),):
        refused = api(switch, "POST", path, handle)
        assert (refused.status, refused.json()["error"]) == (404, "not_found")
    cancelled = api(switch, "POST", f"/v1/jobs/{job_id}/cancel", "ann")
    assert (cancelled.status, cancelled.json()["state"]) == (200, "cancelled")
    again = api(switch, "POST", f"/v1/jobs/{job_id}/cancel", "ann")
    assert (again.status, again.json()["error"]) == (409, "job_ended")


def test_a_job_that_is_not_the_askers_is_404_exactly_like_an_unknown_one(
    switch: Switch,
) -> None:
    api(switch, "PUT", "/v1/me/offline-delivery", "ken", {"enabled": True})
    job_id = queue_one(switch)
    switch.tokens["bob"] = switch.relay.enrol("bob")
    theirs = api(switch, "GET", f"/v1/jobs/{job_id}", "bob")
    unknown = api(switch, "GET", "/v1/jobs/00000000-0000-4000-8000-000000000000", "bob")
    assert theirs.status == unknown.status == 404
    assert theirs.json() == unknown.json()
    assert api(switch, "GET", "/v1/jobs", "bob").json() == {"jobs": []}


@pytest.mark.parametrize("wait", ["31", "-1", "1.5", "x", "", "5&wait=6"])
def test_a_wait_that_is_not_0_to_30_whole_seconds_is_400(switch: Switch, wait: str) -> None:
    api(switch, "PUT", "/v1/me/offline-delivery", "ken", {"enabled": True})
    job_id = queue_one(switch)
    answer = api(switch, "GET", f"/v1/jobs/{job_id}?wait={wait}", "ann")
    assert (answer.status, answer.json()["error"]) == (400, "bad_request")


def test_a_long_poll_answers_when_the_job_ends_or_the_time_is_up(switch: Switch) -> None:
    relay = switch.relay
    api(switch, "PUT", "/v1/me/offline-delivery", "ken", {"enabled": True})
    job_id = queue_one(switch)
    protocol, transport = relay.connect()
    token = switch.tokens["ann"]
    protocol.dataReceived(
        raw_request("GET", f"/v1/jobs/{job_id}?wait=30", token=token, handle="ann")
    )
    assert transport.value() == b"" and relay.relay.jobs.waiting() == 1
    api(switch, "POST", f"/v1/jobs/{job_id}/cancel", "ann")
    answer = parse_answer(transport.value())
    assert (answer.status, answer.json()["state"]) == (200, "cancelled")
    # And one that times out answers with the state as it is.
    second = queue_one(switch)
    protocol, transport = relay.connect()
    protocol.dataReceived(
        raw_request("GET", f"/v1/jobs/{second}?wait=2", token=token, handle="ann")
    )
    relay.reactor.advance(2)
    assert parse_answer(transport.value()).json()["state"] == "queued"


def test_a_long_poll_whose_client_left_is_released(switch: Switch) -> None:
    relay = switch.relay
    api(switch, "PUT", "/v1/me/offline-delivery", "ken", {"enabled": True})
    job_id = queue_one(switch)
    protocol, transport = relay.connect()
    token = switch.tokens["ann"]
    protocol.dataReceived(
        raw_request("GET", f"/v1/jobs/{job_id}?wait=30", token=token, handle="ann")
    )
    assert relay.relay.jobs.waiting() == 1
    protocol.connectionLost(Failure(ConnectionDone()))
    assert relay.relay.jobs.waiting() == 0
    relay.reactor.advance(30)
    assert transport.value() == b""


# --- the listener socket ----------------------------------------------------------------------


def test_a_mailbox_listener_gets_deliveries_and_its_results_are_acked(switch: Switch) -> None:
    api(switch, "PUT", "/v1/me/offline-delivery", "ken", {"enabled": True})
    job_id = queue_one(switch)
    plain = switch.connect("role=listen", "ken")
    assert not [f for f in plain.frames if isinstance(f, JobDelivery)]
    ken = switch.connect("role=listen&mailbox=1", "ken")
    (delivery,) = [f for f in ken.frames if isinstance(f, JobDelivery)]
    assert delivery.job_id == job_id and delivery.envelope == sealed_request()
    ken.send(JobAccepted(job_id=job_id))
    env = sealed_looking(Direction.RESPONSE, "@acme/ken", "@acme/ann")
    ken.send(JobResult(job_id=job_id, terminal=Terminal.COMPLETED, envelope=env))
    switch.flush()
    assert [f for f in ken.frames if isinstance(f, JobAck)] == [JobAck(job_id=job_id)]
    got = api(switch, "GET", f"/v1/jobs/{job_id}", "ann").json()
    assert (got["state"], got["terminal"]) == ("answered", "completed")
    assert codec.decode(json.dumps(got["answer"]), type(env)) == env


@pytest.mark.parametrize(
    "payload",
    [
        b'{"type": "job_result", "job_id": "00000000-0000-4000-8000-000000000001"}',
        b'{"type": "job_accepted", "job_id": "not-a-job"}',
        b'{"type": "job_renew"}',
        b'{"type": "job_delivery", "job_id": "00000000-0000-4000-8000-000000000001"}',
        b"[]",
    ],
)
def test_malformed_job_frames_from_a_listener_are_dropped_without_harm(
    switch: Switch, payload: bytes
) -> None:
    api(switch, "PUT", "/v1/me/offline-delivery", "ken", {"enabled": True})
    job_id = queue_one(switch)
    ken = switch.connect("role=listen&mailbox=1", "ken")
    ken.send_raw(payload)
    switch.flush()
    assert ken.close_code is None
    assert stored_state(switch, job_id) == "delivered"
    ken.send(JobAccepted(job_id=job_id))
    switch.flush()
    assert stored_state(switch, job_id) == "running"


def test_only_a_mailbox_listener_is_asked_for_jobs_held(switch: Switch) -> None:
    plain = switch.connect("role=listen", "ken")
    mailbox = switch.connect("role=listen&mailbox=1", "ann")
    caller = switch.connect("role=call&to=ken", "ann")
    readies = [party.frames[0] for party in (plain, mailbox, caller)]
    assert all(isinstance(ready, Ready) for ready in readies)
    assert [ready.jobs_held for ready in readies if isinstance(ready, Ready)] == [
        False,
        True,
        False,
    ]
    assert b"jobs_held" not in plain.raw[0] + caller.raw[0]


def test_jobs_held_over_the_socket_takes_back_a_gone_sessions_lease_at_once(
    switch: Switch,
) -> None:
    """ken's listener got the job and died before taking it; its next session says it holds
    nothing: the job is delivered again on the spot, not when the lease lapses."""
    api(switch, "PUT", "/v1/me/offline-delivery", "ken", {"enabled": True})
    job_id = queue_one(switch)
    first = switch.connect("role=listen&mailbox=1", "ken")
    assert [f.job_id for f in first.frames if isinstance(f, JobDelivery)] == [job_id]
    assert first.socket is not None
    first.socket.sendClose(1000)
    switch.flush()
    ken = switch.connect("role=listen&mailbox=1", "ken")
    assert not [f for f in ken.frames if isinstance(f, JobDelivery)]
    ken.send(JobsHeld(job_ids=()))
    switch.flush()
    [again] = [f for f in ken.frames if isinstance(f, JobDelivery)]
    assert (again.job_id, again.attempt) == (job_id, 2)
    assert ken.close_code is None


def test_cancel_of_a_running_job_reaches_the_listener_socket(switch: Switch) -> None:
    api(switch, "PUT", "/v1/me/offline-delivery", "ken", {"enabled": True})
    job_id = queue_one(switch)
    ken = switch.connect("role=listen&mailbox=1", "ken")
    ken.send(JobAccepted(job_id=job_id))
    switch.flush()
    api(switch, "POST", f"/v1/jobs/{job_id}/cancel", "ann")
    switch.flush()
    assert [f for f in ken.frames if isinstance(f, CancelJob)] == [CancelJob(job_id=job_id)]


# --- what the relay's database holds -------------------------------------------------------------


def test_the_relay_database_holds_no_plaintext(switch: Switch, tmp_path: Path) -> None:
    """A real sealed request and a real sealed answer go through the mailbox; neither text is
    anywhere in the relay's files."""
    question = "QUESTION-the-relay-must-never-see-7f3a"
    reply_text = "ANSWER-the-relay-must-never-see-91c2"
    ann, ken = make_party("@acme/ann"), make_party("@acme/ken")
    api(switch, "PUT", "/v1/me/offline-delivery", "ken", {"enabled": True})
    sealed, payload = crypto_envelope.seal_request(
        sender=ann.identity_key,
        sender_address="@acme/ann",
        recipient_identity=ken.identity.record,
        recipient_encryption=ken.enc_record,
        relay_origin="relay.example",
        message=question,
        task=None,
        context_id=None,
        now=NOW,
        validity_s=limits.MAX_ENVELOPE_VALIDITY_S,
    )
    job_id = queue_one(switch, CallRequest(envelope=sealed, correlation_id=CORRELATION, queue=True))
    listener = switch.connect("role=listen&mailbox=1", "ken")
    answer = crypto_envelope.seal_response(
        responder=ken.identity_key,
        request=payload,
        outcome=Reply(text=reply_text),
        caller_encryption=ann.enc_record,
        now=NOW,
        validity_s=limits.MAX_ENVELOPE_VALIDITY_S,
    )
    listener.send(JobAccepted(job_id=job_id))
    listener.send(JobResult(job_id=job_id, terminal=Terminal.COMPLETED, envelope=answer))
    switch.flush()
    stored = fired(switch.relay.store.get_job(job_id))
    assert stored is not None and stored.answer is not None
    files = [p for p in tmp_path.iterdir() if p.name.startswith("relay.sqlite")]
    everything = b"".join(path.read_bytes() for path in files)
    # The search looks where the sealed bytes are: both ciphertexts are there.
    assert sealed.ct[-40:].encode() in everything and answer.ct[-40:].encode() in everything
    for secret in (question, reply_text):
        assert secret.encode() not in everything
        assert secret.encode("utf-16-le") not in everything


# --- options ----------------------------------------------------------------------------------


def options(*extra: str) -> tap.Options:
    parsed = tap.Options()
    parsed.parseOptions(["--database", "relay.sqlite", "--url", "http://127.0.0.1:8765", *extra])
    return parsed


def test_the_mailbox_caps_default_to_the_limits_and_reach_the_settings() -> None:
    settings = tap.settings_from(options())
    assert settings.mailbox == MailboxLimits()
    assert settings.mailbox.max_held_bytes_total == 1024**3  # what --help says: 1 GiB
    custom = tap.settings_from(
        options(
            "--mailbox-max-queued",
            "7",
            "--mailbox-max-bytes",
            "2000000",
            "--mailbox-max-total-bytes",
            "3000000",
        )
    )
    assert (
        custom.mailbox.max_queued_per_callee,
        custom.mailbox.max_queued_bytes_per_callee,
        custom.mailbox.max_held_bytes_total,
    ) == (7, 2_000_000, 3_000_000)


def test_the_help_says_what_the_relay_wide_cap_does_and_what_a_caller_sees() -> None:
    text = str(tap.Options())
    assert "--mailbox-max-total-bytes" in text
    words = " ".join(text.split())
    assert "for every callee together" in words and "refused `busy`" in words
    assert "default 1 GiB" in words


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("--mailbox-max-queued", "0"), "--mailbox-max-queued must be between 1 and 100000"),
        (("--mailbox-max-queued", "many"), "--mailbox-max-queued must be a number"),
        (
            ("--mailbox-max-bytes", "1000"),
            f"--mailbox-max-bytes must be between {limits.MAX_REQUEST_FRAME_BYTES} and "
            f"{tap.MAILBOX_MAX_BYTES_OPTION}",
        ),
        (
            ("--mailbox-max-total-bytes", "1000"),
            f"--mailbox-max-total-bytes must be between {limits.MAX_REQUEST_FRAME_BYTES} and "
            f"{tap.MAILBOX_MAX_TOTAL_BYTES_OPTION}",
        ),
        (
            ("--mailbox-max-total-bytes", str(tap.MAILBOX_MAX_TOTAL_BYTES_OPTION + 1)),
            f"--mailbox-max-total-bytes must be between {limits.MAX_REQUEST_FRAME_BYTES} and "
            f"{tap.MAILBOX_MAX_TOTAL_BYTES_OPTION}",
        ),
        (("--mailbox-max-total-bytes", "1GiB"), "--mailbox-max-total-bytes must be a number"),
        (("--mailbox-max-total-bytes", ""), "--mailbox-max-total-bytes must be a number"),
    ],
)
def test_bad_mailbox_caps_are_refused_clearly(args: tuple[str, ...], message: str) -> None:
    with pytest.raises(usage.UsageError) as refused:
        options(*args)
    assert str(refused.value) == message


def test_the_composed_relay_uses_the_configured_caps(tmp_path: Path) -> None:
    relay: MemoryRelay = memory_relay(tmp_path, now=NOW)
    assert relay.relay.jobs.caps == MailboxLimits()


# --- the relay-wide byte cap ---------------------------------------------------------------------


def test_past_the_relay_wide_cap_a_call_is_refused_busy_and_nothing_kept_is_lost(
    tmp_path: Path,
) -> None:
    """Room for one request in all: ann's call to ken is kept, her call to lee is refused
    ``busy`` saying the relay's storage is full (not lee's mailbox), and once ken's job is gone
    the call to lee is kept."""
    one_request = len(codec.encode(sealed_request()))
    caps = MailboxLimits(max_held_bytes_total=one_request + 10)
    with capped_switch(tmp_path, caps) as switch:
        switch.tokens["lee"] = switch.relay.enrol("lee")
        for callee in ("ken", "lee"):
            api(switch, "PUT", "/v1/me/offline-delivery", callee, {"enabled": True})
        job_id = queue_one(switch)
        to_lee = CallRequest(
            envelope=sealed_looking(Direction.REQUEST, "@acme/ann", "@acme/lee"),
            correlation_id=CORRELATION,
            queue=True,
        )
        ann = switch.connect("role=call&to=lee", "ann")
        ann.send(to_lee)
        switch.flush()
        (refused,) = ann.frames[1:]
        assert isinstance(refused, CallError) and refused.code is CallErrorCode.BUSY
        assert refused.detail == queue_refusal(Refusal.RELAY_BYTES_FULL, caps)
        assert "relay's mailbox storage is full" in (refused.detail or "")
        assert stored_state(switch, job_id) == "queued"
        assert fired(switch.relay.store.jobs_of("acme", "lee", 10)) == []
        api(switch, "POST", f"/v1/jobs/{job_id}/cancel", "ann")
        ann = switch.connect("role=call&to=lee", "ann")
        ann.send(to_lee)
        switch.flush()
        assert isinstance(ann.frames[1], CallQueued)


@contextlib.contextmanager
def capped_switch(tmp_path: Path, caps: MailboxLimits) -> Iterator[Switch]:
    """:func:`relay_switch` with the mailbox caps ``caps``."""
    relay = memory_relay(tmp_path, now=NOW, mailbox=caps)
    previous = txaio.config.loop
    txaio.config.loop = relay.reactor
    try:
        yield Switch(relay)
    finally:
        txaio.config.loop = previous
