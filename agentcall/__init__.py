"""AgentCall: call a coworker's coding agent, end-to-end encrypted."""

import os as _os

__version__ = "0.1.0"

# Every WebSocket text frame is decoded strictly as UTF-8 by agentcall.wire.codec, so autobahn's
# own UTF-8 validator is switched off (utf8validateIncoming=False). Its native build would still
# be compiled at import (~50 ms of every CLI start), so tell autobahn not to load it.
_os.environ.setdefault("AUTOBAHN_USE_NVX", "0")
