"""``twistd agentcall-listen``: not built yet.

The listener service arrives with the next piece of work. Until then this plugin refuses to
start with a clear message instead of pretending to listen.
"""

from __future__ import annotations

from twisted.application.service import IService
from twisted.python import usage


class Options(usage.Options):
    synopsis = "(not available yet)"
    longdesc = (
        "NOT BUILT YET: the AgentCall listener (answering calls with a local agent) is not part "
        "of this release. Starting it fails with a clear error; nothing listens."
    )


def makeService(config: Options) -> IService:
    raise SystemExit(
        "agentcall-listen is not available in this release: the listener has not been built yet."
    )
