"""Telling a service manager how the daemon is doing (systemd's ``Type=notify``).

The protocol is one datagram of ``KEY=VALUE`` lines to the UNIX socket named by
``$NOTIFY_SOCKET`` (a path, or an abstract name written with a leading ``@``); no library is
needed. Without the variable (a terminal, a test, another supervisor) nothing is sent. A
failure to send is reported, never raised: the daemon works either way.
"""

from __future__ import annotations

import os
import socket
from collections.abc import Mapping

NOTIFY_ENV = "NOTIFY_SOCKET"


def address_of(value: str) -> str | bytes | None:
    """The socket address ``$NOTIFY_SOCKET`` names, or None for one that cannot be used."""
    if value.startswith("@") and len(value) > 1:
        return b"\0" + value[1:].encode()  # the abstract namespace
    if value.startswith("/"):
        return value
    return None


def notify(state: Mapping[str, str], environ: Mapping[str, str] = os.environ) -> str | None:
    """Send ``state`` (e.g. ``{"READY": "1", "STATUS": "listening on 8443"}``); None when it was
    sent or there is nobody to tell, else why it could not be."""
    value = environ.get(NOTIFY_ENV)
    if not value:
        return None
    address = address_of(value)
    if address is None:
        return f"{NOTIFY_ENV} is not a socket path or an abstract name"
    for key, text in state.items():
        if not key.isupper() or "=" in key or "\n" in text:
            raise ValueError(f"not a notify field: {key!r}")
    message = "".join(f"{key}={text}\n" for key, text in state.items()).encode()
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC) as sock:
            sock.sendto(message, address)
    except OSError as exc:
        return f"cannot notify the service manager: {exc.strerror or exc}"
    return None
