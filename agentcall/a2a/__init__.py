"""The A2A bridge: ``agentcall a2a serve`` speaks A2A v1.0 (its JSON-RPC binding over HTTP) to
local agents and turns each message into an end-to-end sealed AgentCall call.

Pure parts: :mod:`~agentcall.a2a.rpc` (the JSON-RPC envelope, the request shapes, A2A's error
codes), :mod:`~agentcall.a2a.cards` (routes, Host checks, Agent Cards),
:mod:`~agentcall.a2a.tasks` (tasks, their states and events),
:mod:`~agentcall.a2a.contexts` (contextId ↔ AgentCall conversation),
:mod:`~agentcall.a2a.auth` (the bearer token in a request) and
:mod:`~agentcall.a2a.peerpid` (the processes behind a loopback client, read from ``/proc``).
Twisted glue: :mod:`~agentcall.a2a.placing` (the call through the local service or dialled
directly), :mod:`~agentcall.a2a.gate` (who may reach the bridge) and
:mod:`~agentcall.a2a.web` (the ``twisted.web`` resource).
"""
