# twistd plugins for AgentCall. Kept tiny: ServiceMaker imports the tap modules only when used,
# so `twistd --help` never loads the relay or the listener.
from twisted.application.service import ServiceMaker

agentcall_relay = ServiceMaker(
    "AgentCall relay",
    "agentcall.relay.tap",
    "Route end-to-end encrypted AgentCall calls between enrolled identities",
    "agentcall-relay",
)

agentcall_listen = ServiceMaker(
    "AgentCall listener",
    "agentcall.compose.listen",
    "Answer AgentCall calls on this machine with a local coding agent",
    "agentcall-listen",
)
