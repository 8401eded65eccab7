"""The one source of truth for every frame, HTTP body and sealed payload.

The codec's names are also reachable from here, but loaded on first use (PEP 562): the thin
``agentcall call`` imports :mod:`agentcall.wire.local`, which must not pull in the codec and
with it cattrs and attrs.
"""

from __future__ import annotations

from agentcall.errors import MalformedFrame

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

__all__ = ["MalformedFrame", "decode", "decode_frame", "encode", "structure"]

_FROM_CODEC = frozenset({"decode", "decode_frame", "encode", "structure"})


def __getattr__(name: str) -> Any:
    if name in _FROM_CODEC:
        from agentcall.wire import codec

        return getattr(codec, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
