"""The one source of truth for every frame, HTTP body and sealed payload."""

from agentcall.errors import MalformedFrame
from agentcall.wire.codec import decode, decode_frame, encode, structure

__all__ = ["MalformedFrame", "decode", "decode_frame", "encode", "structure"]
