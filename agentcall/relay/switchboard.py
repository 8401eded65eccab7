"""Who is connected: one live listener session per (org, handle), and each caller socket.

A newer connection for the same identity replaces the older one, which is closed with 4000; the
old socket's own teardown (arriving later) must then not unplug the new session. Caller sockets
are only kept so that removing a member can close every socket of theirs at once.
"""

from __future__ import annotations

from typing import Protocol

from agentcall.logevents import Logger
from agentcall.wire.closecodes import CLOSE_REPLACED

REPLACED_REASON = "replaced by a newer connection"

_log = Logger(namespace="agentcall.relay.switchboard")


class Channel(Protocol):
    """The structural twin of :class:`agentcall.interfaces.IChannel` for the type checker.

    zope declarations are invisible to mypy, so cores annotate with this protocol while fakes
    and adapters still declare ``IChannel`` and are checked with ``verifyObject``.
    """

    @property
    def peer(self) -> str: ...

    def send(self, frame: object) -> None: ...

    def close(self, code: int, reason: str) -> None: ...


class Switchboard:
    """The current listener channel of each enrolled identity that is online."""

    def __init__(self) -> None:
        self._listeners: dict[tuple[str, str], Channel] = {}
        # Kept apart from the listeners so an idle listener costs no more than before.
        self._callers: dict[tuple[str, str], set[Channel]] = {}

    def attach_listener(self, org: str, handle: str, channel: Channel) -> None:
        """Make ``channel`` the identity's listener, closing any older session."""
        key = (org, handle)
        older = self._listeners.get(key)
        # Install the new session before closing the old one: closing may synchronously run the
        # old socket's teardown, whose detach must already see that it is no longer current.
        self._listeners[key] = channel
        if older is None:
            # listener_attached (relay/protocol.py) is the session's info line.
            _log.debug("listener_online", org=org, handle=handle)
        elif older is not channel:
            _log.info("listener_replaced", org=org, handle=handle)
            older.close(CLOSE_REPLACED, REPLACED_REASON)

    def detach_listener(self, org: str, handle: str, channel: Channel) -> bool:
        """Forget ``channel`` if it is still the identity's listener; True when it was."""
        key = (org, handle)
        if self._listeners.get(key) is not channel:
            return False
        del self._listeners[key]
        _log.debug("listener_offline", org=org, handle=handle)
        return True

    def attach_caller(self, org: str, handle: str, channel: Channel) -> None:
        self._callers.setdefault((org, handle), set()).add(channel)

    def detach_caller(self, org: str, handle: str, channel: Channel) -> None:
        key = (org, handle)
        channels = self._callers.get(key)
        if channels is None:
            return
        channels.discard(channel)
        if not channels:
            del self._callers[key]

    def close_member(self, org: str, handle: str, code: int, reason: str) -> int:
        """Close every socket of ``@org/handle`` (their listener and their caller sockets);
        how many were closed. Their teardowns detach them as usual."""
        key = (org, handle)
        channels = list(self._callers.get(key, ()))
        listener = self._listeners.get(key)
        if listener is not None:
            channels.append(listener)
        for channel in channels:
            channel.close(code, reason)
        return len(channels)

    def listener_for(self, org: str, handle: str) -> Channel | None:
        return self._listeners.get((org, handle))

    def is_online(self, org: str, handle: str) -> bool:
        return (org, handle) in self._listeners

    def count(self) -> int:
        """How many identities have a live listener."""
        return len(self._listeners)
