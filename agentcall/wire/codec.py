"""One converter, one encoder, one decoder for every wire shape.

:func:`decode` is the boundary: whatever arrives (bytes that are not UTF-8, JSON that is not an
object, a wrong type, a missing or unknown field, an unknown frame type, a duplicate key, more
bytes than allowed) comes out as exactly one error type, :class:`MalformedFrame`.
"""

from __future__ import annotations

import json
from collections.abc import Collection
from typing import Any, TypeVar, get_args, get_origin

import attrs
import cattrs
from cattrs.gen import make_dict_structure_fn, make_dict_unstructure_fn, override

from agentcall import limits, strictjson
from agentcall.errors import MalformedFrame
from agentcall.wire import frames, http, local, payloads

T = TypeVar("T")

converter = cattrs.Converter(forbid_extra_keys=True)

# attrs metadata key: a field left at its default is not written at all. Fields added to a frame
# after peers shipped carry it, so a frame that does not use them reads as it did before.
OMIT_IF_DEFAULT = "agentcall.omit_if_default"


# Strict primitives: cattrs would otherwise coerce (str(5) == "5", int("5") == 5).
def _strict_str(value: Any, _type: Any) -> str:
    if type(value) is not str:
        raise TypeError("expected a string")
    return value


def _strict_int(value: Any, _type: Any) -> int:
    if type(value) is not int:
        raise TypeError("expected an integer")
    return value


def _strict_bool(value: Any, _type: Any) -> bool:
    if type(value) is not bool:
        raise TypeError("expected a boolean")
    return value


converter.register_structure_hook(str, _strict_str)
converter.register_structure_hook(int, _strict_int)
converter.register_structure_hook(bool, _strict_bool)


def _is_variadic_tuple(tp: Any) -> bool:
    args = get_args(tp)
    return get_origin(tp) is tuple and len(args) == 2 and args[1] is Ellipsis


# Every ``tuple[X, ...]`` field is a JSON list on the wire. cattrs alone would iterate any
# iterable, so a string or an object (even "" or {}) would quietly become a tuple.
def _structure_variadic_tuple(value: Any, tp: Any) -> tuple[Any, ...]:
    if type(value) is not list:
        raise TypeError("expected a list")
    item_type = get_args(tp)[0]
    return tuple(converter.structure(item, item_type) for item in value)


converter.register_structure_hook_func(_is_variadic_tuple, _structure_variadic_tuple)


def _register(cls: type[Any]) -> None:
    """Map ``from_`` to the wire name ``from``; refuse unknown keys; keep the frame ``type``."""
    renames: dict[str, Any] = {
        a.name: override(
            rename=a.name.rstrip("_") if a.name.endswith("_") else None,
            omit_if_default=bool(a.metadata.get(OMIT_IF_DEFAULT)),
        )
        for a in attrs.fields(cls)
        if a.name.endswith("_") or a.metadata.get(OMIT_IF_DEFAULT)
    }
    structure = make_dict_structure_fn(cls, converter, _cattrs_forbid_extra_keys=True, **renames)
    unstructure = make_dict_unstructure_fn(cls, converter, **renames)

    def _structure(value: Any, _type: Any) -> Any:
        if type(value) is not dict:
            raise TypeError(f"expected an object for {cls.__name__}")
        return structure(value, cls)

    converter.register_structure_hook(cls, _structure)
    converter.register_unstructure_hook(cls, unstructure)


# Nested classes before the classes that hold them (see the note at SignedResponse below).
for _cls in (
    frames.SealedEnvelope,
    payloads.RequestPayload,
    payloads.SignedRequest,
    http.ApiErrorBody,
    http.StatusResponse,
    http.RegisterRequest,
    http.RegisterResponse,
    http.WhoAmIResponse,
    http.InviteCreateRequest,
    http.InviteInfo,
    http.InviteCreated,
    http.InviteList,
    http.IdentityRecord,
    http.SignedIdentityRecord,
    http.EncryptionKeyRecord,
    http.SignedEncryptionKeyRecord,
    http.KeysResponse,
    http.PresenceResponse,
    http.OfflineDelivery,
    http.JobInfo,
    http.JobList,
):
    _register(_cls)


# Frames carry their type as a ClassVar: encode adds it, decode dispatches on it.
def _register_frame(cls: type[Any]) -> None:
    _register(cls)
    base_unstructure = converter.get_unstructure_hook(cls)

    def _unstructure(value: Any) -> dict[str, Any]:
        return {"type": cls.type, **base_unstructure(value)}

    converter.register_unstructure_hook(cls, _unstructure)


for _frame_cls in frames.FRAME_TYPES.values():
    _register_frame(_frame_cls)
# The local socket's lines (agentcall.wire.local) are tagged the same way.
for _local_cls in local.LOCAL_TYPES.values():
    _register_frame(_local_cls)


# The outcome inside a response is tagged by ``kind``.
def _unstructure_outcome(value: payloads.Outcome) -> dict[str, Any]:
    body = make_dict_unstructure_fn(type(value), converter)(value)
    return {"kind": value.kind, **body}


_OUTCOME_KINDS: dict[str, type[payloads.Outcome]] = {
    payloads.Reply.kind: payloads.Reply,
    payloads.CallFailure.kind: payloads.CallFailure,
}
_outcome_structurers = {
    kind: make_dict_structure_fn(cls, converter, _cattrs_forbid_extra_keys=True)
    for kind, cls in _OUTCOME_KINDS.items()
}


def _structure_outcome(value: Any, _type: Any) -> payloads.Outcome:
    if type(value) is not dict:
        raise TypeError("expected an outcome object")
    body = dict(value)
    kind = body.pop("kind", None)
    if type(kind) is not str or kind not in _OUTCOME_KINDS:
        raise ValueError("unknown outcome kind")
    result: payloads.Outcome = _outcome_structurers[kind](body, _OUTCOME_KINDS[kind])
    return result


for _outcome_cls in (payloads.Reply, payloads.CallFailure):
    converter.register_unstructure_hook(_outcome_cls, _unstructure_outcome)
converter.register_structure_hook(payloads.Outcome, _structure_outcome)
# Order matters: the generated functions capture the hooks of nested classes when they are
# made, so a container is registered only after everything it holds.
_register(payloads.ResponsePayload)
_register(payloads.SignedResponse)


# --- JSON text -------------------------------------------------------------------------------


def parse_json(data: bytes | str, *, max_bytes: int) -> Any:
    """Strict JSON: size first, UTF-8, no duplicate keys, no NaN/Infinity."""
    if len(data) > max_bytes:
        raise MalformedFrame(f"larger than {max_bytes} bytes")
    try:
        text = data.decode("utf-8") if isinstance(data, bytes) else data
        if len(text.encode("utf-8")) > max_bytes:
            raise MalformedFrame(f"larger than {max_bytes} bytes")
        return strictjson.loads(text)
    except MalformedFrame:
        raise
    except (ValueError, UnicodeError, RecursionError) as exc:
        raise MalformedFrame("not valid JSON") from exc


def to_json(value: Any) -> bytes:
    return json.dumps(
        converter.unstructure(value), ensure_ascii=False, separators=(",", ":")
    ).encode("utf-8")


def encode(value: Any) -> bytes:
    """Any wire object (frame, body, payload) as compact UTF-8 JSON."""
    return to_json(value)


def structure(raw: Any, cls: type[T]) -> T:
    """Build a wire object from parsed JSON; every failure is :class:`MalformedFrame`."""
    try:
        return converter.structure(raw, cls)
    except MalformedFrame:
        raise
    except Exception as exc:  # cattrs wraps errors in groups; all mean the same to a receiver
        raise MalformedFrame(f"not a valid {cls.__name__}") from exc


def decode(data: bytes | str, cls: type[T], *, max_bytes: int = limits.MAX_HTTP_BODY_BYTES) -> T:
    """Decode one HTTP body or sealed plaintext of a known shape."""
    return structure(parse_json(data, max_bytes=max_bytes), cls)


def decode_frame(
    data: bytes | str,
    accept: Collection[type[frames.Frame]] | None = None,
    *,
    max_bytes: int = limits.MAX_FRAME_BYTES,
) -> frames.Frame:
    """Decode one WebSocket frame, optionally only of the types this receiver accepts."""
    frame: frames.Frame = _decode_tagged(data, frames.FRAME_TYPES, accept, max_bytes)
    return frame


def decode_local(
    data: bytes | str, accept: Collection[type[Any]], *, max_bytes: int
) -> local.ToService | local.FromService:
    """Decode one line of the local socket (:mod:`agentcall.wire.local`) of an accepted type."""
    line: local.ToService | local.FromService = _decode_tagged(
        data, local.LOCAL_TYPES, accept, max_bytes
    )
    return line


def _decode_tagged(
    data: bytes | str,
    types: dict[str, type[Any]],
    accept: Collection[type[Any]] | None,
    max_bytes: int,
) -> Any:
    raw = parse_json(data, max_bytes=max_bytes)
    if type(raw) is not dict:
        raise MalformedFrame("a frame is a JSON object")
    frame_type = raw.pop("type", None)
    if type(frame_type) is not str or frame_type not in types:
        raise MalformedFrame("unknown frame type")
    cls = types[frame_type]
    if accept is not None and cls not in accept:
        raise MalformedFrame(f"{frame_type} is not expected here")
    return structure(raw, cls)
