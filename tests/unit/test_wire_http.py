"""HTTP bodies and key records: round trips and the rules each body enforces on the wire."""

from __future__ import annotations

import json
from typing import Any

import attrs
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from agentcall import limits
from agentcall.errors import ApiErrorCode, MalformedFrame
from agentcall.wire import codec, http, keyrecords
from tests.hypothesis_profiles import examples
from tests.unit import wire_strategies as ws

HTTP_CLASSES = sorted(ws.HTTP_STRATEGIES, key=lambda cls: cls.__name__)
BIG = limits.MAX_FRAME_BYTES  # room for bodies whose size is not what a test is about

_INVITE_INFO: dict[str, Any] = {
    "id": "ab" * 32,
    "org": "acme",
    "role": "member",
    "status": "active",
    "created_by": "ann",
    "created_at": 1_700_000_000,
    "expires_at": 1_700_604_800,
    "description": "for ken",
    "used_by": None,
}

_KEY_RECORD: dict[str, Any] = {
    "v": 1,
    "relay_origin": "relay.example.com",
    "address": "@acme/ken",
    "key_id": "cd" * 16,
    "suite": http.SUITE_X25519,
    "pub": "P" * 43,
    "epoch": 2,
    "not_before": 1_700_000_000,
    "not_after": 1_700_000_000 + limits.MAX_KEY_VALIDITY_S,
    "prev": "ef" * 16,
}


def _decode(body: dict[str, Any], cls: type[Any], **kwargs: Any) -> Any:
    return codec.decode(json.dumps(body), cls, **kwargs)


def test_every_http_class_has_a_strategy() -> None:
    """A body class added to http.py (or keyrecords.py) without a strategy would escape the
    round trip test."""
    defined = {
        obj
        for obj in vars(http).values()
        if isinstance(obj, type)
        and attrs.has(obj)
        and obj.__module__ in {http.__name__, keyrecords.__name__}
    }
    assert set(HTTP_CLASSES) == defined


# One draw of every class per example (pytest-twisted breaks parametrized hypothesis tests).
@settings(max_examples=examples(40), deadline=None)
@given(data=st.data())
def test_http_body_round_trip(data: st.DataObject) -> None:
    """decode(encode(body), cls) == body for every body and key record class."""
    for cls in HTTP_CLASSES:
        body = data.draw(ws.HTTP_STRATEGIES[cls], label=cls.__name__)
        wire = codec.encode(body)
        assert codec.decode(wire, cls, max_bytes=BIG) == body
        assert "type" not in json.loads(wire)


def test_bodies_use_the_default_http_limit() -> None:
    """decode's default cap is MAX_HTTP_BODY_BYTES: exactly that many bytes pass, one more fails."""
    wire = codec.encode(http.PresenceResponse(address="@acme/ken", online=True))
    exact = wire + b" " * (limits.MAX_HTTP_BODY_BYTES - len(wire))
    assert codec.decode(exact, http.PresenceResponse).online is True
    with pytest.raises(MalformedFrame):
        codec.decode(exact + b" ", http.PresenceResponse)


@pytest.mark.parametrize("invites", ["", "x", {}, {"0": _INVITE_INFO}, [None], [1], None])
def test_invite_list_must_be_a_list_of_objects(invites: object) -> None:
    """A string or object is not a list, even an empty one (cattrs alone would iterate it)."""
    with pytest.raises(MalformedFrame):
        _decode({"invites": invites}, http.InviteList)


def test_invite_list_size_cap() -> None:
    """At most MAX_INVITES_LISTED invites per list."""
    full = [_INVITE_INFO] * limits.MAX_INVITES_LISTED
    assert len(_decode({"invites": full}, http.InviteList, max_bytes=BIG).invites) == len(full)
    with pytest.raises(MalformedFrame):
        _decode({"invites": [*full, _INVITE_INFO]}, http.InviteList, max_bytes=BIG)


def test_invite_create_request_defaults_and_bounds() -> None:
    """An empty request is a 7-day member invite; days outside 1..90 or not an int are refused."""
    default = _decode({}, http.InviteCreateRequest)
    assert default == http.InviteCreateRequest(role=http.MemberRole.MEMBER, expires_in_days=7)
    for days in (limits.INVITE_MIN_DAYS, limits.INVITE_MAX_DAYS):
        assert _decode({"expires_in_days": days}, http.InviteCreateRequest).expires_in_days == days
    for bad in (0, 91, -1, True, 7.0, "7", None):
        with pytest.raises(MalformedFrame):
            _decode({"expires_in_days": bad}, http.InviteCreateRequest)
    with pytest.raises(MalformedFrame):
        _decode({"role": "owner"}, http.InviteCreateRequest)


def test_key_record_accepts_the_reference_record() -> None:
    """The baseline record used below is itself valid, at both edges of its window."""
    record = _decode(_KEY_RECORD, http.EncryptionKeyRecord)
    assert record.not_after - record.not_before == limits.MAX_KEY_VALIDITY_S
    first = {**_KEY_RECORD, "epoch": 1, "prev": None, "not_after": _KEY_RECORD["not_before"] + 1}
    assert _decode(first, http.EncryptionKeyRecord).prev is None


@pytest.mark.parametrize(
    "change",
    [
        {"not_after": _KEY_RECORD["not_before"]},
        {"not_after": _KEY_RECORD["not_before"] - 1},
        {"not_after": _KEY_RECORD["not_before"] + limits.MAX_KEY_VALIDITY_S + 1},
        {"epoch": 1},
        {"prev": None},
        {"epoch": 0},
        {"epoch": 2**31 + 1},
        {"suite": "DHKEM(P-256,HKDF-SHA256)/HKDF-SHA256/AES-128-GCM"},
        {"pub": "P" * 42},
        {"pub": "P" * 43 + "="},
        {"key_id": "CD" * 16},
        {"v": 2},
        {"not_before": -1},
    ],
    ids=repr,
)
def test_key_record_rules(change: dict[str, Any]) -> None:
    """Window positive and at most 30 days; prev null exactly at epoch 1; known suite only."""
    with pytest.raises(MalformedFrame):
        _decode({**_KEY_RECORD, **change}, http.EncryptionKeyRecord)


def test_keys_response_encryption_is_optional() -> None:
    """A keys response may omit the encryption record or give null, not a wrong shape."""
    identity = {
        "record": {
            "v": 1,
            "relay_origin": "relay.example.com",
            "address": "@acme/ken",
            "identity_pub": "I" * 43,
        },
        "signature": "S" * 86,
    }
    assert _decode({"identity": identity}, http.KeysResponse).encryption is None
    assert _decode({"identity": identity, "encryption": None}, http.KeysResponse).encryption is None
    signed_key = {"record": _KEY_RECORD, "signature": "S" * 86}
    both = _decode({"identity": identity, "encryption": signed_key}, http.KeysResponse)
    assert both.encryption is not None
    assert both.encryption.record.epoch == 2
    bad_shapes: list[object] = ["", [], {"record": _KEY_RECORD}, identity]
    for bad in bad_shapes:
        with pytest.raises(MalformedFrame):
            _decode({"identity": identity, "encryption": bad}, http.KeysResponse)


@pytest.mark.parametrize("code", list(ApiErrorCode))
def test_every_api_error_code_decodes(code: ApiErrorCode) -> None:
    """Each published API error code is a valid error body."""
    body = _decode({"error": str(code), "message": "m"}, http.ApiErrorBody)
    assert body.error is code


def test_unknown_api_error_code_is_refused() -> None:
    """An error code outside ApiErrorCode is malformed."""
    for error in ("teapot", "", "BAD_REQUEST", 400):
        with pytest.raises(MalformedFrame):
            _decode({"error": error, "message": "m"}, http.ApiErrorBody)


def test_status_ok_is_a_real_boolean() -> None:
    """``ok`` must be a JSON boolean: 1, "true" and null are refused."""
    base = {"ok": True, "version": "1.0", "relay_origin": "relay.example.com"}
    assert _decode(base, http.StatusResponse).ok is True
    for bad in (1, 0, "true", None):
        with pytest.raises(MalformedFrame):
            _decode({**base, "ok": bad}, http.StatusResponse)


def test_register_request_fields() -> None:
    """agent_kind is optional but must name a known agent; the handle is at most 64 chars."""
    base = {"org": "acme", "invite": "T" * 43, "handle": "ken"}
    assert _decode(base, http.RegisterRequest).agent_kind is None
    chosen = _decode({**base, "agent_kind": "codex"}, http.RegisterRequest)
    assert chosen.agent_kind is http.AgentKind.CODEX
    for change in (
        {"agent_kind": "gpt"},
        {"handle": "k" * 65},
        {"invite": "T" * 42},
        {"invite": "T" * 43 + "\n"},
        {"org": "Acme"},
    ):
        with pytest.raises(MalformedFrame):
            _decode({**base, **change}, http.RegisterRequest)
