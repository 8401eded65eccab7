"""Interfaces between the pure cores and the adapters around them.

Cores (switchboard, call book, listener pipeline) talk to the outside only through these, so
every test can hand them a recording fake that declares the same interface (``verifyObject``).
"""

from __future__ import annotations

from zope.interface import Attribute, Interface


class IChannel(Interface):
    """One connected WebSocket peer, as a core sees it: it can be sent frames and be closed."""

    peer = Attribute("A short description of the peer for logs (never a secret)")

    def send(frame: object) -> None:
        """Send one wire frame (an object from ``agentcall.wire.frames``)."""

    def close(code: int, reason: str) -> None:
        """Close the connection with a WebSocket close code and a short reason."""
