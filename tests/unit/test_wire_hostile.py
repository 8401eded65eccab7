"""Hostile input at the wire boundary: whatever arrives, the only error is MalformedFrame."""

from __future__ import annotations

import copy
import json
from collections.abc import Callable
from typing import Any

import attrs
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from agentcall import limits
from agentcall.errors import PEER_FAILURE_CODES, RELAY_CALL_ERRORS, CallErrorCode, MalformedFrame
from agentcall.wire import codec, frames, payloads
from tests.hypothesis_profiles import examples
from tests.unit import wire_strategies as ws

Path = tuple[str | int, ...]

BODY_CLASSES: list[type[Any]] = sorted(
    [*ws.HTTP_STRATEGIES, *ws.PAYLOAD_STRATEGIES], key=lambda cls: cls.__name__
)
BODY_STRATEGIES = {**ws.HTTP_STRATEGIES, **ws.PAYLOAD_STRATEGIES}
BIG = limits.MAX_FRAME_BYTES


# --- helpers ---------------------------------------------------------------------------------


def _only_malformed(call: Callable[[], Any]) -> Any:
    """Run a decode; MalformedFrame gives None, any other exception fails the test."""
    try:
        return call()
    except MalformedFrame:
        return None


def _dumps(value: Any) -> bytes:
    return json.dumps(value).encode()


def _paths(tree: Any, prefix: Path = ()) -> list[Path]:
    """The path to every value below the root of a parsed JSON tree."""
    found: list[Path] = []
    children: list[tuple[str | int, Any]] = []
    if isinstance(tree, dict):
        children = list(tree.items())
    elif isinstance(tree, list):
        children = list(enumerate(tree))
    for key, value in children:
        found.append((*prefix, key))
        found.extend(_paths(value, (*prefix, key)))
    return found


def _dict_paths(tree: Any, prefix: Path = ()) -> list[Path]:
    """The path to every JSON object in the tree, the root included."""
    found: list[Path] = [prefix] if isinstance(tree, dict) else []
    if isinstance(tree, dict | list):
        items = tree.items() if isinstance(tree, dict) else enumerate(tree)
        for key, value in items:
            found.extend(_dict_paths(value, (*prefix, key)))
    return found


def _at(tree: Any, path: Path) -> Any:
    for key in path:
        tree = tree[key]
    return tree


# One value of each JSON kind; a mutation picks one whose kind differs from the original's.
_KIND_SAMPLES: list[Any] = ["x", 7, 1.5, True, [], {}]


def _tree_of(value: Any) -> Any:
    return json.loads(codec.encode(value))


# --- random input ----------------------------------------------------------------------------


@settings(max_examples=examples(200), deadline=None)
@given(data=st.binary(max_size=200) | st.binary(max_size=40).map(lambda b: b'{"type":' + b))
def test_random_bytes_to_decode_frame(data: bytes) -> None:
    """Random bytes never raise anything but MalformedFrame from decode_frame."""
    _only_malformed(lambda: codec.decode_frame(data))


@settings(max_examples=examples(200), deadline=None)
@given(data=st.binary(max_size=200), cls=st.sampled_from(BODY_CLASSES))
def test_random_bytes_to_decode(data: bytes, cls: type[Any]) -> None:
    """Random bytes never raise anything but MalformedFrame from decode, for any body class."""
    _only_malformed(lambda: codec.decode(data, cls))


@settings(max_examples=examples(150), deadline=None)
@given(text=ws.hostile_text, cls=st.sampled_from(BODY_CLASSES))
def test_random_text_including_lone_surrogates(text: str, cls: type[Any]) -> None:
    """A str argument, lone surrogates included, only ever fails as MalformedFrame."""
    _only_malformed(lambda: codec.decode_frame(text))
    _only_malformed(lambda: codec.decode(text, cls))


@settings(max_examples=examples(200), deadline=None)
@given(value=ws.json_values | ws.frame_shaped)
def test_json_values_to_decode_frame(value: Any) -> None:
    """Any JSON value (NaN, lone-surrogate escapes too) fails only as MalformedFrame."""
    result = _only_malformed(lambda: codec.decode_frame(json.dumps(value)))
    assert result is None or type(result) in frames.FRAME_TYPES.values()


@settings(max_examples=examples(200), deadline=None)
@given(
    value=ws.json_values | ws.frame_shaped,
    cls=st.sampled_from([*BODY_CLASSES, *frames.FRAME_TYPES.values()]),
)
def test_json_values_to_decode_and_structure(value: Any, cls: type[Any]) -> None:
    """decode and structure, given any JSON-ish value for any class, fail only as MalformedFrame."""
    for result in (
        _only_malformed(lambda: codec.decode(json.dumps(value), cls, max_bytes=BIG)),
        _only_malformed(lambda: codec.structure(value, cls)),
    ):
        assert result is None or type(result) is cls


@settings(max_examples=examples(150), deadline=None)
@given(shape=ws.frame_shaped, frame_type=st.sampled_from(sorted(frames.FRAME_TYPES)))
def test_frame_shaped_objects_with_a_real_type(shape: dict[str, Any], frame_type: str) -> None:
    """Objects with a real ``type`` and plausible keys still only fail as MalformedFrame."""
    result = _only_malformed(lambda: codec.decode_frame(_dumps({**shape, "type": frame_type})))
    assert result is None or type(result) is frames.FRAME_TYPES[frame_type]


# --- mutations of valid frames and bodies ----------------------------------------------------

_valid_wire_objects = ws.any_frame | st.sampled_from(BODY_CLASSES).flatmap(
    lambda cls: BODY_STRATEGIES[cls]
)


def _decode_like(original: Any, tree: Any) -> Any:
    """Decode a (mutated) tree the way the original's receiver would."""
    if type(original) in frames.FRAME_TYPES.values():
        return codec.decode_frame(_dumps(tree))
    return codec.decode(_dumps(tree), type(original), max_bytes=BIG)


@settings(max_examples=examples(150), deadline=None)
@given(original=_valid_wire_objects, data=st.data())
def test_adding_an_unknown_field_anywhere_is_refused(original: Any, data: st.DataObject) -> None:
    """Every object on the wire has a closed set of keys: one more, at any depth, is refused."""
    tree = _tree_of(original)
    target = _at(tree, data.draw(st.sampled_from(_dict_paths(tree)), label="object"))
    key = data.draw(st.text(max_size=12).filter(lambda k: k not in target), label="key")
    target[key] = data.draw(ws.json_values, label="value")
    with pytest.raises(MalformedFrame):
        _decode_like(original, tree)


@settings(max_examples=examples(150), deadline=None)
@given(original=_valid_wire_objects, data=st.data())
def test_changing_a_value_to_another_json_kind_is_refused(
    original: Any, data: st.DataObject
) -> None:
    """No field accepts two JSON kinds (besides null for optional ones), at any depth."""
    tree = _tree_of(original)
    paths = [path for path in _paths(tree) if _at(tree, path) is not None]
    path = data.draw(st.sampled_from(paths), label="path")
    old = _at(tree, path)
    new = data.draw(
        st.sampled_from([v for v in _KIND_SAMPLES if type(v) is not type(old)]), label="new"
    )
    _at(tree, path[:-1])[path[-1]] = copy.deepcopy(new)
    with pytest.raises(MalformedFrame):
        _decode_like(original, tree)


@settings(max_examples=examples(150), deadline=None)
@given(original=_valid_wire_objects, data=st.data())
def test_dropping_a_field(original: Any, data: st.DataObject) -> None:
    """A dropped top-level field is refused unless it has a default, which then fills it in;
    a field dropped deeper only ever fails as MalformedFrame."""
    tree = _tree_of(original)
    paths = [p for p in _paths(tree) if isinstance(p[-1], str)]
    path = data.draw(st.sampled_from(paths), label="path")
    del _at(tree, path[:-1])[path[-1]]
    if len(path) > 1:
        result = _only_malformed(lambda: _decode_like(original, tree))
        assert result is None or type(result) is type(original)
        return
    wire_name = path[0]
    if wire_name == "type":
        with pytest.raises(MalformedFrame):
            _decode_like(original, tree)
        return
    field = next(a for a in attrs.fields(type(original)) if a.name.rstrip("_") == wire_name)
    if field.default is attrs.NOTHING:
        with pytest.raises(MalformedFrame):
            _decode_like(original, tree)
    else:
        try:
            expected = attrs.evolve(original, **{field.alias: field.default})
        except ValueError:
            # The default breaks a rule across fields (a job result's terminal goes with its
            # envelope): the decoder must refuse the same way.
            with pytest.raises(MalformedFrame):
                _decode_like(original, tree)
            return
        assert _decode_like(original, tree) == expected


@settings(max_examples=examples(150), deadline=None)
@given(frame=ws.any_frame, new_type=st.sampled_from(sorted(frames.FRAME_TYPES)))
def test_swapping_the_frame_type(frame: Any, new_type: str) -> None:
    """A frame relabelled as another type either fails or decodes as exactly that type, with every
    field it carried (a swap cannot smuggle or drop data)."""
    tree = _tree_of(frame)
    tree["type"] = new_type
    result = _only_malformed(lambda: codec.decode_frame(_dumps(tree)))
    if result is not None:
        assert type(result) is frames.FRAME_TYPES[new_type]
        assert tree.items() <= _tree_of(result).items()


@settings(max_examples=examples(150), deadline=None)
@given(body=st.sampled_from(BODY_CLASSES).flatmap(lambda c: BODY_STRATEGIES[c]), data=st.data())
def test_decoding_a_body_as_another_class(body: Any, data: st.DataObject) -> None:
    """A body read as the wrong class either fails or keeps every key it carried."""
    cls = data.draw(st.sampled_from(BODY_CLASSES), label="as")
    tree = _tree_of(body)
    result = _only_malformed(lambda: codec.decode(_dumps(tree), cls, max_bytes=BIG))
    if result is not None:
        assert type(result) is cls
        assert tree.items() <= _tree_of(result).items()


# --- the hostile table -----------------------------------------------------------------------

CALL_ID = "0b7e3f1e-2c4d-4a5b-9c6d-7e8f90a1b2c3"
CORRELATION_ID = "5f" * 16
ENVELOPE: dict[str, Any] = {
    "v": 1,
    "direction": "request",
    "relay_origin": "relay.example.com",
    "from": "@acme/ann",
    "to": "@acme/ken",
    "key_id": "ab" * 16,
    "epoch": 3,
    "ct": "C" * 64,
}
INCOMING: dict[str, Any] = {
    "type": "incoming_call",
    "call_id": CALL_ID,
    "from": "ann",
    "envelope": ENVELOPE,
    "correlation_id": CORRELATION_ID,
    "groups": ["R" * 16],
}
INCOMING_WIRE = _dumps(INCOMING)


def _with(**changes: Any) -> bytes:
    return _dumps({**INCOMING, **changes})


def _envelope_with(**changes: Any) -> bytes:
    return _with(envelope={**ENVELOPE, **changes})


def _without(key: str, base: dict[str, Any] = INCOMING) -> dict[str, Any]:
    return {k: v for k, v in base.items() if k != key}


def _renamed(base: dict[str, Any], old: str, new: str) -> dict[str, Any]:
    return {(new if k == old else k): v for k, v in base.items()}


def test_the_baseline_frame_is_valid() -> None:
    """Every hostile row below is one change away from this valid incoming_call."""
    frame = codec.decode_frame(INCOMING_WIRE)
    assert isinstance(frame, frames.IncomingCall)
    assert frame.from_ == "ann"
    assert frame.envelope.from_ == "@acme/ann"
    assert frame.groups == ("R" * 16,)


HOSTILE_FRAMES: dict[str, bytes] = {
    "not utf-8": INCOMING_WIRE.replace(b'"ann"', b'"a\xffn"'),
    "utf-8 encoded surrogate": INCOMING_WIRE.replace(b'"ann"', b'"a\xed\xa0\x80n"'),
    "overlong utf-8": INCOMING_WIRE.replace(b'"ann"', b'"a\xc0\xafn"'),
    "byte order mark": b"\xef\xbb\xbf" + INCOMING_WIRE,
    "empty": b"",
    "whitespace only": b" \n\t",
    "top-level array": _dumps([INCOMING]),
    "top-level string": _dumps("incoming_call"),
    "top-level number": b"5",
    "top-level null": b"null",
    "top-level true": b"true",
    "two frames in one message": INCOMING_WIRE + INCOMING_WIRE,
    "truncated": INCOMING_WIRE[:-1],
    "duplicate key": INCOMING_WIRE.replace(b'"from": "ann"', b'"from": "ann", "from": "ann"'),
    "duplicate type": INCOMING_WIRE.replace(
        b'"type": "incoming_call"', b'"type": "cancel_call", "type": "incoming_call"'
    ),
    "duplicate key in envelope": INCOMING_WIRE.replace(b'"epoch": 3', b'"epoch": 3, "epoch": 3'),
    "NaN": INCOMING_WIRE.replace(b'"epoch": 3', b'"epoch": NaN'),
    "Infinity": INCOMING_WIRE.replace(b'"epoch": 3', b'"epoch": Infinity'),
    "-Infinity": INCOMING_WIRE.replace(b'"epoch": 3', b'"epoch": -Infinity'),
    "float overflowing to infinity": INCOMING_WIRE.replace(b'"epoch": 3', b'"epoch": 1e400'),
    "integer too long to parse": INCOMING_WIRE.replace(b'"epoch": 3', b'"epoch": ' + b"9" * 5000),
    "bool where int expected (v)": _envelope_with(v=True),
    "bool where int expected (epoch)": _envelope_with(epoch=True),
    "float where int expected": _envelope_with(epoch=3.0),
    "int as string": _envelope_with(epoch="3"),
    "int where str expected (call_id)": _with(call_id=5),
    "int where str expected (from)": _with(**{"from": 5}),
    "str where list expected": _with(groups="R" * 16),
    "object where list expected": _with(groups={}),
    "list where str expected": _with(call_id=[CALL_ID]),
    "null where required": _with(call_id=None),
    "null for a defaulted list": _with(groups=None),
    "missing call_id": _dumps(_without("call_id")),
    "missing from": _dumps(_without("from")),
    "missing envelope": _dumps(_without("envelope")),
    "missing correlation_id": _dumps(_without("correlation_id")),
    "missing envelope field": _with(envelope=_without("ct", ENVELOPE)),
    "unknown extra field": _with(traceparent="00-abc"),
    "unknown extra field in envelope": _envelope_with(extra=1),
    "unknown frame type": _with(type="call_reply"),
    "empty frame type": _with(type=""),
    "frame type in another case": _with(type="Incoming_Call"),
    "frame type with a space": _with(type="incoming_call "),
    "type missing": _dumps(_without("type")),
    "type is a number": _with(type=5),
    "type is null": _with(type=None),
    "type is a list": _with(type=["incoming_call"]),
    "type is an object": _with(type={"incoming_call": 1}),
    "python name from_ on the wire": _dumps(_renamed(INCOMING, "from", "from_")),
    "python name from_ in the envelope": _with(envelope=_renamed(ENVELOPE, "from", "from_")),
    "both from and from_": _with(from_="ann"),
    "envelope is a string": _with(envelope="sealed"),
    "envelope is a list": _with(envelope=[ENVELOPE]),
    "envelope is null": _with(envelope=None),
    "envelope version 2": _envelope_with(v=2),
    "envelope direction unknown": _envelope_with(direction="sideways"),
    "envelope ct padded": _envelope_with(ct="C" * 62 + "=="),
    "envelope ct standard base64": _envelope_with(ct="C" * 63 + "+"),
    "envelope ct too short": _envelope_with(ct="C" * 43),
    "envelope epoch 0": _envelope_with(epoch=0),
    "envelope from a handle, not an address": _envelope_with(**{"from": "ann"}),
    "call_id all zeros": _with(call_id="00000000-0000-0000-0000-000000000000"),
    "call_id uppercase": _with(call_id=CALL_ID.upper()),
    "call_id not version 4": _with(call_id="0b7e3f1e-2c4d-1a5b-9c6d-7e8f90a1b2c3"),
    "call_id with trailing newline": _with(call_id=CALL_ID + "\n"),
    "correlation_id all zeros": _with(correlation_id="0" * 32),
    "correlation_id uppercase": _with(correlation_id=CORRELATION_ID.upper()),
    "correlation_id too short": _with(correlation_id="5f" * 15 + "5"),
    "correlation_id with trailing newline": _with(correlation_id=CORRELATION_ID + "\n"),
    "from with trailing newline": _with(**{"from": "ann\n"}),
    "from is an address": _with(**{"from": "@acme/ann"}),
    "51 groups": _with(groups=["R" * 16] * 51),
    "group id too short": _with(groups=["R" * 15]),
    "lone surrogate in call_error detail": (
        b'{"type":"call_error","code":"offline","detail":"\\ud800"}'
    ),
}


@pytest.mark.parametrize("wire", HOSTILE_FRAMES.values(), ids=HOSTILE_FRAMES.keys())
def test_hostile_frame_is_malformed(wire: bytes) -> None:
    """Each row is refused as MalformedFrame (and only as that)."""
    with pytest.raises(MalformedFrame):
        codec.decode_frame(wire)


def test_defaulted_groups_may_be_omitted() -> None:
    """``groups`` has a default: leaving it out is fine (unlike null, in the table above)."""
    frame = codec.decode_frame(_dumps(_without("groups")))
    assert isinstance(frame, frames.IncomingCall)
    assert frame.groups == ()


# --- sealed request messages -----------------------------------------------------------------

SIGNED_REQUEST: dict[str, Any] = {
    "payload": {
        "v": 1,
        "direction": "request",
        "relay_origin": "relay.example.com",
        "from": "@acme/ann",
        "to": "@acme/ken",
        "request_id": "12" * 16,
        "sender_key_id": "34" * 16,
        "recipient_key_id": "56" * 16,
        "recipient_epoch": 1,
        "issued_at": 1_700_000_000,
        "expires_at": 1_700_000_360,
        "task": "review",
        "context_id": None,
        "message": "why is CI red?",
    },
    "signature": "S" * 86,
}


def _request_with_message(message_json: str) -> str:
    """The signed request with its message given as raw JSON string text (escapes kept)."""
    placeholder = "@@MESSAGE@@"
    text = json.dumps(
        {**SIGNED_REQUEST, "payload": {**SIGNED_REQUEST["payload"], "message": placeholder}}
    )
    return text.replace(json.dumps(placeholder), message_json)


def _decode_request(text: str) -> payloads.SignedRequest:
    return codec.decode(text, payloads.SignedRequest, max_bytes=BIG)


@pytest.mark.parametrize(
    "message_json",
    [
        '"\\ud800"',
        '"before \\udfff after"',
        '"\\udc00\\ud800"',
        '""',
        json.dumps("a" * (limits.MAX_MESSAGE_BYTES + 1)),
        json.dumps("é" * (limits.MAX_MESSAGE_BYTES // 2) + "a", ensure_ascii=False),
        "null",
        "5",
        '["hi"]',
    ],
    ids=[
        "lone high surrogate",
        "lone low surrogate",
        "reversed pair",
        "0 bytes",
        "MAX_MESSAGE_BYTES+1 ascii bytes",
        "MAX_MESSAGE_BYTES+1 utf-8 bytes",
        "null",
        "number",
        "list",
    ],
)
def test_hostile_message_is_malformed(message_json: str) -> None:
    """The message must be 1..64,000 UTF-8 bytes of well-formed Unicode."""
    with pytest.raises(MalformedFrame):
        _decode_request(_request_with_message(message_json))


@pytest.mark.parametrize(
    ("message_json", "expected"),
    [
        ('"\\ud83d\\ude00"', "\U0001f600"),
        ('"x"', "x"),
        (json.dumps("a" * limits.MAX_MESSAGE_BYTES), "a" * limits.MAX_MESSAGE_BYTES),
        (json.dumps("é" * (limits.MAX_MESSAGE_BYTES // 2)), "é" * (limits.MAX_MESSAGE_BYTES // 2)),
    ],
    ids=["escaped surrogate pair", "1 byte", "MAX_MESSAGE_BYTES ascii", "MAX_MESSAGE_BYTES utf-8"],
)
def test_message_edges_that_are_accepted(message_json: str, expected: str) -> None:
    """A proper surrogate pair and a message of exactly 1 or MAX_MESSAGE_BYTES bytes are fine."""
    assert _decode_request(_request_with_message(message_json)).payload.message == expected


def test_signed_request_payload_field_names() -> None:
    """Inside the sealed payload, ``from_`` on the wire is refused and ``from`` is required."""
    payload = SIGNED_REQUEST["payload"]
    assert _decode_request(json.dumps(SIGNED_REQUEST)).payload.from_ == "@acme/ann"
    for bad in (_renamed(payload, "from", "from_"), _without("from", payload)):
        with pytest.raises(MalformedFrame):
            _decode_request(json.dumps({**SIGNED_REQUEST, "payload": bad}))


# --- error codes: relay codes in call_error, peer codes in sealed failures --------------------


@pytest.mark.parametrize("code", list(CallErrorCode), ids=str)
def test_call_error_takes_only_relay_codes(code: CallErrorCode) -> None:
    """call_error (unauthenticated, from the relay) carries relay codes, never peer verdicts."""
    wire = _dumps({"type": "call_error", "code": str(code), "call_id": CALL_ID})
    if code in RELAY_CALL_ERRORS:
        frame = codec.decode_frame(wire)
        assert isinstance(frame, frames.CallError)
        assert frame.code is code
    else:
        with pytest.raises(MalformedFrame):
            codec.decode_frame(wire)


def test_peer_verdicts_are_not_relay_codes() -> None:
    """Codes only a callee can decide are missing from the relay set."""
    for code in ("agent_error", "blocked", "task_unknown", "task_not_offered", "context_unknown"):
        assert CallErrorCode(code) not in RELAY_CALL_ERRORS
    assert CallErrorCode.CONNECTION_FAILED not in RELAY_CALL_ERRORS | PEER_FAILURE_CODES


@pytest.mark.parametrize("code", list(CallErrorCode), ids=str)
def test_sealed_failure_takes_only_peer_codes(code: CallErrorCode) -> None:
    """A sealed failure outcome carries peer codes, never relay-only ones."""
    response = {
        **{
            k: v
            for k, v in SIGNED_REQUEST["payload"].items()
            if k not in ("task", "context_id", "message")
        },
        "direction": "response",
        "request_transcript_hash": "ab" * 32,
        "outcome": {"kind": "failure", "code": str(code), "detail": None, "offered": []},
    }
    text = json.dumps(response)
    if code in PEER_FAILURE_CODES:
        decoded = codec.decode(text, payloads.ResponsePayload)
        assert isinstance(decoded.outcome, payloads.CallFailure)
        assert decoded.outcome.code is code
    else:
        with pytest.raises(MalformedFrame):
            codec.decode(text, payloads.ResponsePayload)


def test_call_rejected_is_always_a_protocol_error() -> None:
    """call_rejected defaults to protocol_error and refuses any other code."""
    frame = codec.decode_frame(_dumps({"type": "call_rejected", "call_id": CALL_ID}))
    assert isinstance(frame, frames.CallRejected)
    assert frame.code is CallErrorCode.PROTOCOL_ERROR
    with pytest.raises(MalformedFrame):
        codec.decode_frame(_dumps({"type": "call_rejected", "call_id": CALL_ID, "code": "busy"}))


# --- receiver sets ---------------------------------------------------------------------------

RECEIVER_SETS = {
    "FROM_CALLER": frames.FROM_CALLER,
    "FROM_LISTENER": frames.FROM_LISTENER,
    "TO_CALLER": frames.TO_CALLER,
    "TO_LISTENER": frames.TO_LISTENER,
}


@settings(max_examples=examples(25), deadline=None)
@given(data=st.data())
def test_frame_accepted_only_when_its_class_is_in_accept(data: st.DataObject) -> None:
    """decode_frame with ``accept`` takes exactly the listed classes, for every frame and set."""
    for cls in frames.FRAME_TYPES.values():
        wire = codec.encode(data.draw(ws.FRAME_STRATEGIES[cls], label=cls.type))
        for accept in RECEIVER_SETS.values():
            if cls in accept:
                assert type(codec.decode_frame(wire, accept=accept)) is cls
            else:
                with pytest.raises(MalformedFrame):
                    codec.decode_frame(wire, accept=accept)
        with pytest.raises(MalformedFrame):
            codec.decode_frame(wire, accept=())


# --- size caps -------------------------------------------------------------------------------


def _padded(size: int) -> bytes:
    """The baseline frame padded with trailing whitespace to exactly ``size`` bytes."""
    return INCOMING_WIRE + b" " * (size - len(INCOMING_WIRE))


@pytest.fixture
def parser_must_not_run(monkeypatch: pytest.MonkeyPatch) -> None:
    """Make any JSON parsing fail loudly, to prove a rejection came before it."""

    def refuse(*_args: object, **_kwargs: object) -> object:
        raise AssertionError("the JSON parser ran on oversize input")

    monkeypatch.setattr(json, "loads", refuse)


def test_exactly_max_bytes_is_accepted() -> None:
    """Input of exactly max_bytes decodes."""
    size = len(INCOMING_WIRE) + 10
    assert isinstance(codec.decode_frame(_padded(size), max_bytes=size), frames.IncomingCall)
    assert isinstance(
        codec.decode_frame(_padded(size).decode(), max_bytes=size), frames.IncomingCall
    )


@pytest.mark.usefixtures("parser_must_not_run")
def test_one_byte_over_is_refused_before_parsing() -> None:
    """max_bytes + 1 bytes are refused without being parsed, as bytes or as str."""
    size = len(INCOMING_WIRE) + 10
    with pytest.raises(MalformedFrame):
        codec.decode_frame(_padded(size + 1), max_bytes=size)
    with pytest.raises(MalformedFrame):
        codec.decode_frame(_padded(size + 1).decode(), max_bytes=size)
    with pytest.raises(MalformedFrame):
        codec.decode(_padded(size + 1), frames.SealedEnvelope, max_bytes=size)


@pytest.mark.usefixtures("parser_must_not_run")
def test_str_input_is_measured_in_utf8_bytes() -> None:
    """A str under max_bytes in characters but over it in UTF-8 bytes is refused unparsed."""
    text = '"' + "é" * 10 + '"'
    assert len(text) <= 20 < len(text.encode())
    with pytest.raises(MalformedFrame):
        codec.decode_frame(text, max_bytes=20)


@pytest.mark.usefixtures("parser_must_not_run")
def test_default_caps_refuse_before_parsing() -> None:
    """Without max_bytes, frames are capped at MAX_FRAME_BYTES and bodies at MAX_HTTP_BODY_BYTES."""
    with pytest.raises(MalformedFrame):
        codec.decode_frame(_padded(limits.MAX_FRAME_BYTES + 1))
    with pytest.raises(MalformedFrame):
        codec.decode(_padded(limits.MAX_HTTP_BODY_BYTES + 1), frames.SealedEnvelope)


# --- deep nesting ----------------------------------------------------------------------------

_DEPTH = 100_000
DEEP_INPUTS = {
    "nested lists": "[" * _DEPTH + "]" * _DEPTH,
    "nested objects": '{"a":' * _DEPTH + "null" + "}" * _DEPTH,
    "nested in a field": '{"type":"cancel_call","call_id":' + "[" * _DEPTH + "]" * _DEPTH + "}",
    "nesting the parser survives": '{"type":"cancel_call","call_id":' + "[" * 500 + "]" * 500 + "}",
}


@pytest.mark.parametrize("text", DEEP_INPUTS.values(), ids=DEEP_INPUTS.keys())
def test_deep_nesting_is_malformed_not_recursion_error(text: str) -> None:
    """Deeply nested JSON is a MalformedFrame, never a RecursionError escaping the decoder."""
    with pytest.raises(MalformedFrame):
        codec.decode_frame(text)
    with pytest.raises(MalformedFrame):
        codec.decode(text, payloads.SignedRequest, max_bytes=BIG)


def test_a_ciphertext_is_copied_into_the_text_exactly_as_json_would_write_it() -> None:
    """The encoder splices base64url ciphertexts in rather than scanning them: the bytes must
    be exactly what json.dumps gives, one envelope or several, and a text field that happens to
    look like the stand-in is written as itself."""
    import json as _json

    from agentcall.wire import codec as _codec
    from agentcall.wire import frames as _fr

    def envelope(ct: str) -> _fr.SealedEnvelope:
        return _fr.SealedEnvelope(
            v=1,
            direction=_fr.Direction.REQUEST,
            relay_origin="relay.example:8443",
            from_="@acme/ann",
            to="@acme/ken",
            key_id="a" * 32,
            epoch=1,
            ct=ct,
        )

    def plain(value: object) -> bytes:
        raw = _codec.converter.unstructure(value)
        return _json.dumps(raw, ensure_ascii=False, separators=(",", ":")).encode()

    ct = "Zm9vYmFy-_" * 5000
    incoming = _fr.IncomingCall(
        call_id="7d1b0d2e-5bd1-4b8a-9a43-3f8d2c3e0a11",
        from_="ann",
        envelope=envelope(ct),
        correlation_id="b" * 32,
    )
    lookalike = _fr.CallError(
        code=CallErrorCode.PROTOCOL_ERROR, detail=_codec._MARKER[1:] + ' "}{\\u0000'
    )
    for value in (incoming, lookalike, _fr.CallStatus(call_id=incoming.call_id, state="ringing")):
        assert _codec.encode(value) == plain(value)
        assert _codec.decode_frame(_codec.encode(value)) == value
    # Several ciphertexts in one document keep their places.
    other = attrs.evolve(incoming, envelope=envelope("QUJD" * 20))
    both = [incoming, other, incoming]
    assert _codec.to_json(both) == plain(both)


def test_a_frame_without_ciphertext_is_not_walked_for_one(monkeypatch: pytest.MonkeyPatch) -> None:
    """The search for ciphertexts to splice runs only when the body holds one: a call_status
    (the relay writes three per call) goes straight to json.dumps, with the same bytes."""
    import json as _json

    from agentcall.wire import codec as _codec
    from agentcall.wire import frames as _fr

    status = _fr.CallStatus(call_id="7d1b0d2e-5bd1-4b8a-9a43-3f8d2c3e0a11", state="working")
    walked: list[object] = []
    real_lift = _codec._lift

    def lift(node: object, lifted: list[str]) -> object:
        walked.append(node)
        return real_lift(node, lifted)

    monkeypatch.setattr(_codec, "_lift", lift)
    expected = _json.dumps(_codec.converter.unstructure(status), separators=(",", ":")).encode()
    assert _codec.encode(status) == expected and walked == []
    sealed = _fr.SealedEnvelope(
        v=1,
        direction=_fr.Direction.REQUEST,
        relay_origin="relay.example:8443",
        from_="@acme/ann",
        to="@acme/ken",
        key_id="a" * 32,
        epoch=1,
        ct="Zm9vYmFy-_" * 50,
    )
    request = _fr.CallRequest(envelope=sealed, correlation_id="b" * 32)
    assert _codec.decode_frame(_codec.encode(request)) == request and walked != []
