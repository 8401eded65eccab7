"""Field validators shared by every wire shape.

attrs runs these when a value object is built, whether by our own code or by the decoder, so a
frame that exists in memory has already passed them.
"""

from __future__ import annotations

import re
from collections.abc import Callable

from agentcall import ids

# attrs and typing are named in annotations only: the thin CLI's lines (agentcall.wire.local)
# use these validators without importing either (each costs that process milliseconds).
TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

    import attrs

    Validator = Callable[[Any, "attrs.Attribute[Any]", Any], None]

# \Z, not $, which would also accept a trailing newline.
B64URL_RE = re.compile(r"^[A-Za-z0-9_-]*\Z")


def matches(regex: re.Pattern[str]) -> Validator:
    def check(_inst: Any, attribute: attrs.Attribute[Any], value: Any) -> None:
        if not isinstance(value, str) or regex.match(value) is None:
            raise ValueError(f"{attribute.name}: not a valid value")

    return check


def text(max_chars: int, *, min_chars: int = 0) -> Validator:
    """A string of bounded length that is well-formed Unicode (no lone surrogates)."""

    def check(_inst: Any, attribute: attrs.Attribute[Any], value: Any) -> None:
        if not isinstance(value, str):
            raise ValueError(f"{attribute.name}: expected a string")
        if not min_chars <= len(value) <= max_chars:
            raise ValueError(f"{attribute.name}: length outside {min_chars}..{max_chars}")
        try:
            value.encode("utf-8")
        except UnicodeEncodeError as exc:
            raise ValueError(f"{attribute.name}: not well-formed Unicode") from exc

    return check


def utf8_bytes(max_bytes: int, *, min_bytes: int = 0) -> Validator:
    def check(_inst: Any, attribute: attrs.Attribute[Any], value: Any) -> None:
        if not isinstance(value, str):
            raise ValueError(f"{attribute.name}: expected a string")
        try:
            size = len(value.encode("utf-8"))
        except UnicodeEncodeError as exc:
            raise ValueError(f"{attribute.name}: not well-formed Unicode") from exc
        if not min_bytes <= size <= max_bytes:
            raise ValueError(f"{attribute.name}: size outside {min_bytes}..{max_bytes} bytes")

    return check


def b64url(max_chars: int, *, min_chars: int = 1) -> Validator:
    def check(_inst: Any, attribute: attrs.Attribute[Any], value: Any) -> None:
        if (
            not isinstance(value, str)
            or not min_chars <= len(value) <= max_chars
            or B64URL_RE.match(value) is None
        ):
            raise ValueError(f"{attribute.name}: not base64url of an acceptable size")

    return check


def integer(lo: int, hi: int) -> Validator:
    def check(_inst: Any, attribute: attrs.Attribute[Any], value: Any) -> None:
        if isinstance(value, bool) or not isinstance(value, int) or not lo <= value <= hi:
            raise ValueError(f"{attribute.name}: integer outside {lo}..{hi}")

    return check


def boolean(_inst: Any, attribute: attrs.Attribute[Any], value: Any) -> None:
    if type(value) is not bool:
        raise ValueError(f"{attribute.name}: expected true or false")


def optional(inner: Validator) -> Validator:
    def check(inst: Any, attribute: attrs.Attribute[Any], value: Any) -> None:
        if value is not None:
            inner(inst, attribute, value)

    return check


def each(inner: Validator, *, max_items: int) -> Validator:
    def check(inst: Any, attribute: attrs.Attribute[Any], value: Any) -> None:
        if not isinstance(value, tuple) or len(value) > max_items:
            raise ValueError(f"{attribute.name}: at most {max_items} items")
        for item in value:
            inner(inst, attribute, item)

    return check


def exactly(expected: object) -> Validator:
    def check(_inst: Any, attribute: attrs.Attribute[Any], value: Any) -> None:
        if type(value) is not type(expected) or value != expected:
            raise ValueError(f"{attribute.name}: must be {expected!r}")

    return check


# Common field validators.
handle = matches(ids.HANDLE_RE)
org = matches(ids.ORG_RE)
address = matches(ids.ADDRESS_RE)
task_id = matches(ids.TASK_RE)
hex32 = matches(ids.HEX32_RE)
hex64 = matches(ids.HEX64_RE)
call_id = matches(ids.CALL_ID_RE)
job_id = matches(ids.JOB_ID_RE)
correlation_id = matches(ids.CORRELATION_ID_RE)
context_id = matches(ids.CONTEXT_ID_RE)
roster_id = matches(ids.ROSTER_ID_RE)
relay_origin = matches(ids.RELAY_ORIGIN_RE)
token = matches(ids.TOKEN_RE)
# Seconds since the epoch, as integers; bounded so canonical i64 encoding never overflows.
timestamp = integer(0, 2**40)
epoch_number = integer(1, 2**31)
