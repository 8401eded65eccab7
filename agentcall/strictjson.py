"""Strict JSON, the one reading of JSON for wire frames and the files people or peers write.

Python's :func:`json.loads` quietly keeps the last of two equal keys and accepts ``NaN``,
``Infinity`` and ``-Infinity``, none of which is JSON (RFC 8259). A duplicate key lets two
readers see different documents; a non-finite number slips past every range check, since it
compares false with everything. Both are refused here, each with its own error so a caller
can name the problem in its own terms.
"""

from __future__ import annotations

import json
import math

# typing is imported for the type checker only: the thin `agentcall call` imports this module,
# and typing costs that process milliseconds (tests/unit/test_cli_call_thin.py).
TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any, NoReturn


class DuplicateKey(ValueError):
    """An object names the same key twice."""

    def __init__(self, key: str) -> None:
        super().__init__(f"duplicate key {key!r}")
        self.key = key


class NotJsonConstant(ValueError):
    """``NaN``, ``Infinity`` or ``-Infinity``: Python reads them, JSON has no such values."""

    def __init__(self, name: str) -> None:
        super().__init__(f"{name} is not JSON")
        self.name = name


def _no_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    # Built in one go (every frame the relay reads comes through here); only an object that
    # came out shorter than its pairs is walked again, to name the key it repeats.
    result = dict(pairs)
    if len(result) != len(pairs):
        seen: set[str] = set()
        for key, _value in pairs:
            if key in seen:
                raise DuplicateKey(key)
            seen.add(key)
    return result


def _no_constants(name: str) -> NoReturn:
    raise NotJsonConstant(name)


def _finite(literal: str) -> float:
    value = float(literal)
    # A literal past the float range (1e999) reads as an infinity: refused like Infinity.
    if math.isinf(value):
        raise NotJsonConstant(literal)
    return value


def loads(text: str) -> Any:
    """Parse ``text`` as strict JSON.

    :raises DuplicateKey: an object repeats a key.
    :raises NotJsonConstant: the text holds NaN or an infinity, or a number that reads as one.
    :raises ValueError: any other problem (:class:`json.JSONDecodeError` for bad syntax).
    :raises RecursionError: the nesting is too deep for the parser.
    """
    return _DECODER.decode(text)


# One decoder for every call: json.loads with options builds a new one each time.
_DECODER = json.JSONDecoder(
    object_pairs_hook=_no_duplicates, parse_constant=_no_constants, parse_float=_finite
)
