"""``agentcall doctor``'s key lines: when the current encryption key expires, and whether
anything is renewing it (pure: the keys and ``now`` are passed in); and whether a recovery
code was issued (from the marker file ``recovery.json`` in the state directory).

Keys last 30 days. The listener renews its key at start and, checking every 6 hours, once
fewer than 7 days remain; every ``agentcall call`` renews it too. So a key with fewer than
:data:`WARN_BEFORE_S` (6 days) left has gone at least a day past its renewal point with
nothing renewing it: a warning then never fires for a healthy running listener, and still
leaves days to act before callers see ``keys_expired``.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Final

from agentcall import limits
from agentcall.cli.doctor_checks import FAIL, OK, WARN, Check

if TYPE_CHECKING:
    from agentcall.local.home import Home
    from agentcall.local.keystore import LocalKeys

NAME: Final = "key expiry"
DAY_S: Final = 24 * 3600
WARN_BEFORE_S: Final = limits.KEY_ROTATE_BEFORE_S - DAY_S
START_LISTENER: Final = (
    "start the listener (`systemctl --user restart agentcall-listener`, or `agentcall listen`):"
    " it mints and publishes a fresh key as it starts"
)
CALLER_RENEWS: Final = "your next `agentcall call` mints and publishes a fresh one"


def _date(seconds: int) -> str:
    return time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime(seconds))


def _span(seconds: float) -> str:
    if seconds >= 2 * DAY_S:
        return f"{seconds / DAY_S:.0f} days"
    hours = round(seconds / 3600)
    return "1 hour" if hours == 1 else f"{hours} hours"


def key_expiry(keys: LocalKeys, now: float, *, caller_only: bool) -> Check:
    """✓ with the date; ! within :data:`WARN_BEFORE_S` of expiry; past it, ✗ for an
    installation that answers calls (callers cannot reach it), ! for a caller-only one (it
    receives answers only to its own calls, which renew the key first)."""
    current = keys.epochs[-1]
    not_after = current.record.record.not_after
    left = not_after - now
    which = f"encryption key epoch {current.epoch}"
    renewer = CALLER_RENEWS if caller_only else START_LISTENER
    if left <= 0:
        detail = f"{which} expired on {_date(not_after)} ({_span(-left)} ago)"
        if caller_only:
            return Check(NAME, WARN, detail, renewer)
        return Check(NAME, FAIL, detail + ": callers are told you are offline", renewer)
    detail = f"{which} expires on {_date(not_after)} (in {_span(left)})"
    if left < WARN_BEFORE_S:
        why = "; nothing has renewed it (a running listener renews it 7 days before)"
        return Check(NAME, WARN, detail + why, renewer)
    return Check(NAME, OK, detail + "; renewed automatically while the listener runs")


# --- the recovery code -----------------------------------------------------------------------

RECOVERY_NAME: Final = "recovery code"
# Written by `agentcall recovery issue` beside config.json: {"issued_at": <unix seconds>, …}.
MAX_RECOVERY_BYTES: Final = 4096
NO_RECOVERY: Final = "no recovery code issued: `agentcall recovery issue` makes one"
RECOVERY_HINT: Final = (
    "without one, a lost ~/.agentcall loses this address for good; `agentcall recovery issue` "
    "makes one (keep it offline)"
)


def recovery_code(home: Home) -> Check:
    """Whether a recovery code was issued, from the marker file only (it holds no secret, and
    none of its other fields is shown)."""
    from agentcall.errors import MalformedFrame
    from agentcall.local.home import LocalStateError
    from agentcall.wire import codec

    path = home.recovery_marker_path
    try:
        data = home.read_private(path)
    except FileNotFoundError:
        return Check(RECOVERY_NAME, WARN, NO_RECOVERY, RECOVERY_HINT)
    except LocalStateError as exc:
        return Check(RECOVERY_NAME, WARN, f"unproven: {exc}")
    try:
        raw = codec.parse_json(data, max_bytes=MAX_RECOVERY_BYTES)
    except MalformedFrame:
        return Check(RECOVERY_NAME, WARN, f"unproven: {path} is not valid JSON")
    issued = raw.get("issued_at") if isinstance(raw, dict) else None
    if type(issued) is not int or not 0 < issued < 2**40:
        return Check(RECOVERY_NAME, WARN, f"unproven: {path} has no valid issued_at")
    return Check(RECOVERY_NAME, OK, f"issued on {_date(issued)}; keep it somewhere offline")
