"""WebSocket close codes on the relay socket, the one list both ends read.

1000 is the standard normal closure; the 4000-4999 range is left by RFC 6455 to applications.
The relay sends all of these; the caller and the listener send only ``CLOSE_NORMAL`` and
``CLOSE_PROTOCOL_ERROR``, and the listener stops for good on ``CLOSE_REPLACED`` and
``CLOSE_REMOVED``.
"""

from __future__ import annotations

from typing import Final

CLOSE_NORMAL: Final = 1000
# A newer listener session for the same identity took over this one.
CLOSE_REPLACED: Final = 4000
CLOSE_UNAUTHORIZED: Final = 4001
# An admin removed this member from the organisation: its token no longer works.
CLOSE_REMOVED: Final = 4004
# The member rotated its token: reconnect with the new one (the listener re-reads config.json).
CLOSE_CREDENTIALS_CHANGED: Final = 4005
# The member's identity was recovered on another machine: this installation is cut off for good.
CLOSE_RECOVERED: Final = 4006
CLOSE_PROTOCOL_ERROR: Final = 4002
CLOSE_BAD_REQUEST: Final = 4003
# Over a front-door cap (too many caller sockets for one identity); 4029 echoes HTTP 429.
CLOSE_TOO_MANY: Final = 4029
