"""Keys, signed and HPKE-sealed envelopes, trust-on-first-use pins and the replay window.

Pure logic: no I/O and no clock; every check that depends on time takes ``now``.
"""

from agentcall.crypto.envelope import open_request, open_response, seal_request, seal_response
from agentcall.crypto.keys import EncryptionKey, IdentityKey, fingerprint, key_id, verify_signature
from agentcall.crypto.pins import IPinStorage, MemoryPinStorage, Pin, PinBook, PinState
from agentcall.crypto.replay import ReplayWindow, ReplayWindowFull

__all__ = [
    "EncryptionKey",
    "IPinStorage",
    "IdentityKey",
    "MemoryPinStorage",
    "Pin",
    "PinBook",
    "PinState",
    "ReplayWindow",
    "ReplayWindowFull",
    "fingerprint",
    "key_id",
    "open_request",
    "open_response",
    "seal_request",
    "seal_response",
    "verify_signature",
]
