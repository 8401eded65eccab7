"""One converter, one encoder, one decoder for every wire shape.

:func:`decode` is the boundary: whatever arrives (bytes that are not UTF-8, JSON that is not an
object, a wrong type, a missing or unknown field, an unknown frame type, a duplicate key, more
bytes than allowed) comes out as exactly one error type, :class:`MalformedFrame`.
"""

from __future__ import annotations

import json
import secrets
from collections.abc import Collection
from types import UnionType
from typing import TYPE_CHECKING, Any, TypeVar, Union, get_args, get_origin

import attrs
import cattrs
from cattrs.gen import make_dict_structure_fn, make_dict_unstructure_fn, override

from agentcall import limits, strictjson
from agentcall.errors import MalformedFrame

if TYPE_CHECKING:
    from agentcall.wire import frames

T = TypeVar("T")

converter = cattrs.Converter(forbid_extra_keys=True)

# attrs metadata key: a field left at its default is not written at all. Fields added to a frame
# after peers shipped carry it, so a frame that does not use them reads as it did before.
OMIT_IF_DEFAULT = "agentcall.omit_if_default"
# attrs metadata key: the field's validator admits only text JSON never escapes (base64url), so
# the encoder copies it into the output as it is (see to_json).
UNESCAPED = "agentcall.unescaped"


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


# Every attrs class of these modules is a wire shape. Their hooks are made the first time a
# shape is encoded or decoded, not at import: a process pays only for the shapes it uses (the
# thin `agentcall call` uses a handful), and a container's hook asks for its fields' hooks as it
# is made, so no registration order matters.
_WIRE_MODULES = frozenset(
    {
        "agentcall.wire.frames",
        "agentcall.wire.http",
        "agentcall.wire.keyrecords",
        "agentcall.wire.payloads",
        "agentcall.wire.local",
    }
)


def _tag(cls: type[Any], name: str) -> str | None:
    """A ClassVar tag (a frame's ``type``, an outcome's ``kind``); not a field of that name."""
    value = cls.__dict__.get(name)
    return value if isinstance(value, str) else None


def _is_wire_shape(tp: Any) -> bool:
    return isinstance(tp, type) and attrs.has(tp) and tp.__module__ in _WIRE_MODULES


def _overrides(cls: type[Any]) -> dict[str, Any]:
    """Map ``from_`` to the wire name ``from``; leave a later field out while at its default."""
    return {
        a.name: override(
            rename=a.name.rstrip("_") if a.name.endswith("_") else None,
            omit_if_default=bool(a.metadata.get(OMIT_IF_DEFAULT)),
        )
        for a in attrs.fields(cls)
        if a.name.endswith("_") or a.metadata.get(OMIT_IF_DEFAULT)
    }


def _structure_hook(cls: type[Any]) -> Any:
    """Refuse anything but an object, and unknown keys."""
    structure = make_dict_structure_fn(
        cls, converter, _cattrs_forbid_extra_keys=True, **_overrides(cls)
    )

    tag = _tag(cls, "type")

    def _structure(value: Any, _type: Any) -> Any:
        if type(value) is not dict:
            raise TypeError(f"expected an object for {cls.__name__}")
        if tag is not None and "type" in value:
            # A tagged shape inside another (a local jobs ending's call result) is encoded
            # with its tag; only its own tag is accepted there.
            if value["type"] != tag:
                raise ValueError(f"expected a {tag}")
            value = {k: v for k, v in value.items() if k != "type"}
        return structure(value, cls)

    return _structure


class _Unescaped(str):
    """A field's text that JSON never escapes (see ``UNESCAPED``), marked for :func:`to_json`."""

    __slots__ = ()


# How many _Unescaped texts unstructuring has made: to_json walks a body for them only when
# this moved while it was built (most frames, a call_status say, carry none).
_UNESCAPED_MADE = [0]


class _Verbatim(str):
    """A sub-document's JSON text, already made, spliced into :func:`to_json`'s output as it is."""

    __slots__ = ()


# The JSON text of shapes that say ``encode_once`` (the key records a relay attaches to every
# incoming_call), by the identity of the object encoded: (object, text). Frozen objects never
# change, and a store that reads new records hands out a new object, which is encoded anew.
_ENCODED_ONCE: dict[int, tuple[Any, str]] = {}
ENCODED_ONCE_MAX = 1024
# True while to_json unstructures: only then is a cached text handed out (a plain
# converter.unstructure still gets the dict).
_SPLICING = [False]


def _encode_once(base: Any) -> Any:
    def cached(value: Any) -> Any:
        if not _SPLICING[0]:
            return base(value)
        entry = _ENCODED_ONCE.get(id(value))
        if entry is None or entry[0] is not value:
            made = _UNESCAPED_MADE[0]
            text = _json_text(base(value), made)
            if len(_ENCODED_ONCE) >= ENCODED_ONCE_MAX:
                del _ENCODED_ONCE[next(iter(_ENCODED_ONCE))]
            entry = _ENCODED_ONCE[id(value)] = (value, text)
        _UNESCAPED_MADE[0] += 1
        return _Verbatim(entry[1])

    return cached


def _unstructure_hook(cls: type[Any]) -> Any:
    """Frames (and local lines) carry their ``type``, outcomes their ``kind``: encode adds it,
    decode dispatches on it."""
    base = make_dict_unstructure_fn(cls, converter, **_overrides(cls))
    if cls.__dict__.get("encode_once") is True:
        return _encode_once(base)
    unescaped = [a.name for a in attrs.fields(cls) if a.metadata.get(UNESCAPED)]
    if unescaped:
        plain = base

        def base(value: Any) -> dict[str, Any]:
            body: dict[str, Any] = plain(value)
            for name in unescaped:
                if isinstance(body.get(name), str):
                    body[name] = _Unescaped(body[name])
                    _UNESCAPED_MADE[0] += 1
            return body

    for name in ("type", "kind"):
        tag = _tag(cls, name)
        if tag is not None:

            def _tagged(value: Any, _name: str = name, _tag: str = tag) -> dict[str, Any]:
                return {_name: _tag, **base(value)}

            return _tagged
    return base


converter.register_structure_hook_factory(_is_wire_shape, _structure_hook)
converter.register_unstructure_hook_factory(_is_wire_shape, _unstructure_hook)


# The local socket's lines (agentcall.wire.local) are not attrs classes (the thin CLI does not
# import attrs): they write themselves, and encode() takes them like any other wire object.
def _is_local_line(tp: Any) -> bool:
    return (
        isinstance(tp, type)
        and tp.__module__ == "agentcall.wire.local"
        and callable(getattr(tp, "to_wire", None))
    )


converter.register_unstructure_hook_func(_is_local_line, lambda value: value.to_wire())


# The outcome inside a response (payloads.Outcome, a union) is tagged by ``kind``.
def _is_outcome(tp: Any) -> bool:
    args = get_args(tp)
    return (
        get_origin(tp) in (Union, UnionType)
        and len(args) > 1
        and all(
            _is_wire_shape(a) and a.__module__ == "agentcall.wire.payloads" and _tag(a, "kind")
            for a in args
        )
    )


def _outcome_hook(tp: Any) -> Any:
    kinds: dict[str, type[Any]] = {str(_tag(cls, "kind")): cls for cls in get_args(tp)}
    structurers = {
        kind: make_dict_structure_fn(cls, converter, _cattrs_forbid_extra_keys=True)
        for kind, cls in kinds.items()
    }

    def _structure_outcome(value: Any, _type: Any) -> Any:
        if type(value) is not dict:
            raise TypeError("expected an outcome object")
        body = dict(value)
        kind = body.pop("kind", None)
        if type(kind) is not str or kind not in kinds:
            raise ValueError("unknown outcome kind")
        return structurers[kind](body, kinds[kind])

    return _structure_outcome


converter.register_structure_hook_factory(_is_outcome, _outcome_hook)


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


# Stands in for each unescaped field while json.dumps runs; the random part cannot occur in
# any other value, and the NUL is written escaped, so the marker's JSON text is unique.
_MARKER = "\x00agentcall-unescaped-" + secrets.token_hex(16)
_MARKER_JSON = json.dumps(_MARKER)


def _lift(node: Any, lifted: list[str]) -> Any:
    """``node`` with each unescaped text and each ready-made sub-document replaced by the
    marker, their JSON texts kept in order."""
    if isinstance(node, _Unescaped):
        lifted.append(f'"{node}"')
        return _MARKER
    if isinstance(node, _Verbatim):
        lifted.append(str(node))
        return _MARKER
    if isinstance(node, dict):
        return {key: _lift(item, lifted) for key, item in node.items()}
    if isinstance(node, list | tuple):
        return [_lift(item, lifted) for item in node]
    return node


def to_json(value: Any) -> bytes:
    """Compact UTF-8 JSON. A ciphertext (up to a few hundred KB of base64url, which JSON never
    escapes) is copied into the text instead of being scanned character by character by
    json.dumps: that scan was most of the cost of encoding a frame that carries one. A shape
    marked ``encode_once`` is encoded once per object and its text spliced in after that."""
    made = _UNESCAPED_MADE[0]
    splicing, _SPLICING[0] = _SPLICING[0], True
    try:
        body = converter.unstructure(value)
    finally:
        _SPLICING[0] = splicing
    return _json_text(body, made).encode("utf-8")


def _json_text(body: Any, made: int) -> str:
    """The compact JSON text of an unstructured ``body``; ``made``: the count of spliced texts
    before it was unstructured (unchanged: nothing to splice)."""
    if _UNESCAPED_MADE[0] == made:
        return json.dumps(body, ensure_ascii=False, separators=(",", ":"))
    lifted: list[str] = []
    body = _lift(body, lifted)
    text = json.dumps(body, ensure_ascii=False, separators=(",", ":"))
    if lifted:
        pieces = text.split(_MARKER_JSON)
        text = pieces[0] + "".join(
            f"{raw}{rest}" for raw, rest in zip(lifted, pieces[1:], strict=True)
        )
    return text


# A class attribute naming a shape's hand-written encoder: for small, frequent shapes whose
# every field its validators hold to text JSON never escapes. It must give the very bytes the
# generic encoder gives (a test compares).
HAND_WRITTEN = "hand_written_json"


def encode(value: Any) -> bytes:
    """Any wire object (frame, body, payload) as compact UTF-8 JSON."""
    write = getattr(type(value), HAND_WRITTEN, None)
    return to_json(value) if write is None else write(value, _nested_text)


def _nested_text(value: Any) -> str:
    """A sub-document's JSON text, for a hand-written encoder."""
    return to_json(value).decode("utf-8")


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
    from agentcall.wire import frames

    frame: frames.Frame = _decode_tagged(data, frames.FRAME_TYPES, accept, max_bytes)
    return frame


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
