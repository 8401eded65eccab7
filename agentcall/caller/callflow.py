"""One call from what the person typed to everything ``agentcall call`` prints about it.

Both ways a call is placed run this: the CLI dialling the relay itself, and the listener
service placing the call a thin ``agentcall call`` handed it over the local socket
(:mod:`agentcall.compose.listen`). It resolves TARGET (contacts), works out which conversation
``--continue`` / ``--context`` mean (:mod:`agentcall.caller.outbound`), places the call with
:func:`agentcall.caller.call.place` (``api`` and ``dial`` as the caller injects them),
records the conversation an answer opened, and returns a
:class:`~agentcall.wire.local.LocalEnded`: the value the CLI renders on either path.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from agentcall import limits
from agentcall.caller import call as caller
from agentcall.caller import outbound
from agentcall.errors import AgentCallError
from agentcall.local.config import Config
from agentcall.local.contacts import ContactBook
from agentcall.local.home import Home, LocalStateError
from agentcall.local.keystore import load_keys
from agentcall.wire.frames import CallStatus
from agentcall.wire.local import EndKind, LocalCall, LocalEnded, clip

StatusSink = Callable[[CallStatus], None]
NoteSink = Callable[[str], None]


def ended_from_result(
    result: caller.CallResult,
    task: str | None,
    *,
    ended: bool = False,
    conversation_note: str | None = None,
) -> LocalEnded:
    """``result`` as the CLI prints it. ``task``: the one asked for (an answer that names none
    ran it); ``ended``: the conversation it continued is over (``context_unknown``)."""
    if result.job is not None:
        return LocalEnded(
            EndKind.QUEUED,
            result.address,
            job_id=result.job.job_id,
            expires_at=result.job.expires_at,
        )
    if result.reply is not None:
        return LocalEnded(
            EndKind.ANSWER,
            result.address,
            result.call_id,
            text=result.reply.text,
            task=result.reply.task or task,
            context_id=result.reply.context_id,
            conversation_note=conversation_note,
        )
    if result.code is None:
        raise ValueError("a CallResult without a reply must carry a code")
    return LocalEnded(
        EndKind.FAILED,
        result.address,
        result.call_id,
        code=str(result.code),
        detail=None if result.detail is None else clip(result.detail),
        offered=result.offered,
        ended=ended,
        conversation_note=conversation_note,
    )


async def run_call(
    reactor: Any,
    home: Home,
    config: Config,
    on_status: StatusSink,
    on_note: NoteSink,
    *,
    target: str,
    message: str,
    task: str | None = None,
    use_continue: bool = False,
    context_id: str | None = None,
    queue: bool = True,
    timeout_s: float = limits.CLIENT_CALL_TIMEOUT_S,
    api: caller.KeyDirectory | None = None,
    dial: caller.Dial | None = None,
) -> LocalEnded:
    """Place a call as this installation, with the options as ``agentcall call`` takes them
    (``target`` as typed); every way it can end is the returned value."""
    try:
        address = ContactBook(home).resolve(target, config.org)
    except LocalStateError as exc:
        return LocalEnded.refused("bad_target", str(exc))
    try:
        keys = load_keys(home)
    except LocalStateError as exc:
        return LocalEnded.refused("local_error", str(exc), address)

    start = reactor.seconds()
    sent: outbound.Continuation | None = None
    try:
        if use_continue or context_id is not None:
            sent = outbound.load_continuation(
                home,
                config.relay_origin,
                peer=address,
                task=task,
                use_continue=use_continue,
                context_id=context_id,
                now=start,
            )
        result = await caller.place(
            reactor,
            home,
            config,
            keys,
            address,
            message,
            task if sent is None else sent.task,
            on_status,
            timeout_s=timeout_s,
            api=api,
            dial=dial,
            on_note=on_note,
            context_id=None if sent is None else sent.context_id,
            queue=queue,
        )
    except (caller.CallRefused, outbound.ConversationError) as exc:
        return LocalEnded.refused(exc.code, str(exc), address)
    asked_task = task
    task = task if sent is None else sent.task
    if sent is None and (result.reply is None or result.reply.context_id is None):
        return ended_from_result(result, task)
    try:
        settled = outbound.record_outcome(
            home,
            config.relay_origin,
            peer=address,
            sent=sent,
            task=asked_task,
            reply=result.reply,
            code=result.code,
            now=reactor.seconds(),
        )
    except AgentCallError as exc:
        on_note(f"could not update your open conversations: {exc}")
        return ended_from_result(result, task)
    return ended_from_result(
        result, task, ended=settled.ended, conversation_note=settled.note(address)
    )


async def run_request(
    reactor: Any,
    home: Home,
    config: Config,
    request: LocalCall,
    on_status: StatusSink,
    on_note: NoteSink,
    *,
    api: caller.KeyDirectory | None = None,
    dial: caller.Dial | None = None,
) -> LocalEnded:
    """:func:`run_call` for a request a thin CLI sent over the local socket."""
    return await run_call(
        reactor,
        home,
        config,
        on_status,
        on_note,
        target=request.target,
        message=request.message,
        task=request.task,
        use_continue=request.continue_,
        context_id=request.context_id,
        queue=request.queue,
        timeout_s=request.timeout_s,
        api=api,
        dial=dial,
    )
