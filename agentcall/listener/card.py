"""The card: what goes on it (a pure core), and keeping the relay's copy current (an adapter).

**What a card reveals.** Every member of the organisation can fetch it, so it carries only what
the owner offers to everyone by default: the agent kind, and the tasks on the default menu
(``default_offer`` that the admin ceiling lets run, none when ``default_access`` is
``blocked``), each as its id, its name and the first line of its description. Never on it:
individual grants and blocks, groups, tools, workdirs, timeouts, connectors, keywords,
examples, instructions, file paths. :func:`card_offer` is the only place that decides this
(``docs/security.md``, "The card").

:class:`CardPublisher` is how the listener service keeps its published card current: it
publishes at start (once the relay is connected) and, on a timer, whenever what the card would
say differs from what it last published — the owner's files are read afresh for every call, so
any edit of ``policy.json``, a task or the ceiling is noticed at the next check. A failed
publish is logged and tried again at the next check.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol

import attrs
from twisted.internet import defer
from twisted.internet.interfaces import IReactorTime

from agentcall import limits
from agentcall.crypto.card import make_card
from agentcall.crypto.keys import IdentityKey
from agentcall.errors import ApiError
from agentcall.listener.admission import runnable_tools
from agentcall.listener.ceiling import Ceiling
from agentcall.listener.policy import Access, Policy
from agentcall.listener.stages import AdmissionInputs
from agentcall.listener.tasks import TaskSet
from agentcall.logevents import Logger
from agentcall.safetext import safe_cell
from agentcall.wire.http import AgentKind, CardRecord, CardTask, SignedCardRecord

_log = Logger(namespace="agentcall.listener.card")


@attrs.frozen
class CardOffer:
    """What a card says, before it is dated and signed."""

    agent_kind: AgentKind | None
    tasks: tuple[CardTask, ...] = ()
    omitted: int = 0


def _clip(text: str, max_bytes: int) -> str:
    data = text.encode("utf-8")
    if len(data) <= max_bytes:
        return text
    # Cut on a character boundary, leaving room for the ellipsis (3 bytes).
    return data[: max_bytes - 3].decode("utf-8", "ignore").rstrip() + "…"


def summary_of(description: str) -> str:
    """A task's description as the card shows it: its first non-empty line, terminal-safe,
    at most ``MAX_CARD_SUMMARY_BYTES``."""
    lines = [line.strip() for line in description.splitlines() if line.strip()]
    first = " ".join(safe_cell(lines[0] if lines else "").split())
    return _clip(first or "(no description)", limits.MAX_CARD_SUMMARY_BYTES)


def _name(name: str, task_id: str) -> str:
    cleaned = " ".join(safe_cell(name).split())
    return _clip(cleaned or task_id, limits.MAX_CARD_NAME_BYTES)


def card_offer(
    agent_kind: AgentKind | None, policy: Policy, ceiling: Ceiling | None, tasks: TaskSet
) -> CardOffer:
    """The card of an installation: the default menu only (see the module docstring)."""
    if agent_kind is None:
        return CardOffer(agent_kind=None)
    if policy.default_access is not Access.ALLOWED:
        return CardOffer(agent_kind=agent_kind)
    menu = sorted(set(policy.default_offer) & set(runnable_tools(ceiling, tasks)))
    chosen: list[CardTask] = []
    used = 0
    for task_id in menu:
        task = tasks.tasks[task_id]
        entry = CardTask(
            id=task_id, name=_name(task.name, task_id), summary=summary_of(task.description)
        )
        size = len(f"{entry.id}{entry.name}{entry.summary}".encode())
        if len(chosen) >= limits.MAX_CARD_TASKS or used + size > limits.MAX_CARD_TEXT_BYTES:
            break
        chosen.append(entry)
        used += size
    return CardOffer(agent_kind=agent_kind, tasks=tuple(chosen), omitted=len(menu) - len(chosen))


def offer_of(record: CardRecord) -> CardOffer:
    return CardOffer(agent_kind=record.agent_kind, tasks=record.tasks, omitted=record.omitted)


def sign_offer(
    offer: CardOffer, identity: IdentityKey, relay_origin: str, address: str, now: float
) -> SignedCardRecord:
    return make_card(
        identity,
        relay_origin,
        address,
        issued_at=int(now),
        agent_kind=offer.agent_kind,
        tasks=offer.tasks,
        omitted=offer.omitted,
    )


def drift(published: CardRecord, local: CardOffer) -> list[str]:
    """What differs between a published card and the one the local files make, in words
    (empty: they say the same)."""
    if offer_of(published) == local:
        return []
    found: list[str] = []
    if published.agent_kind != local.agent_kind:
        found.append(
            f"agent {published.agent_kind or 'none'} published, {local.agent_kind or 'none'} here"
        )
    there = {task.id: task for task in published.tasks}
    here = {task.id: task for task in local.tasks}
    for task_id in sorted(here.keys() - there.keys()):
        found.append(f"task {task_id} offered here but not on the published card")
    for task_id in sorted(there.keys() - here.keys()):
        found.append(f"task {task_id} on the published card but no longer offered")
    for task_id in sorted(here.keys() & there.keys()):
        if here[task_id] != there[task_id]:
            found.append(f"task {task_id} has another name or description here")
    if published.omitted != local.omitted and not found:
        found.append("the number of tasks left off the card differs")
    return found


class CardApi(Protocol):
    def put_card(self, signed: SignedCardRecord) -> defer.Deferred[Any]: ...


class CardPublisher:
    """Publishes the listener's card when it changes (see the module docstring)."""

    def __init__(
        self,
        *,
        make_offer: Callable[[], CardOffer],
        sign: Callable[[CardOffer], SignedCardRecord],
        api: Callable[[], CardApi],
        connected: Callable[[], bool],
    ) -> None:
        self._make_offer = make_offer
        self._sign = sign
        self._api = api
        self._connected = connected
        self._published: CardOffer | None = None
        self._busy = False

    @property
    def published(self) -> CardOffer | None:
        """What this service last published (None before its first publish succeeded)."""
        return self._published

    def check(self) -> defer.Deferred[None]:
        """Publish if the card changed since the last publish; never raises (a timer calls it)."""
        return defer.Deferred.fromCoroutine(self._check())

    async def _check(self) -> None:
        if self._busy or not self._connected():
            return
        try:
            offer = self._make_offer()
        except Exception as exc:
            # A broken file refuses every call anyway; the card stays as it was.
            _log.warn("card_unreadable", reason=type(exc).__name__)
            return
        if offer == self._published:
            return
        self._busy = True
        try:
            await self._api().put_card(self._sign(offer))
        except ApiError as exc:
            _log.warn("card_publish_failed", reason=str(exc.code), retry="next check")
            return
        except Exception as exc:
            _log.warn("card_publish_failed", reason=type(exc).__name__, retry="next check")
            return
        finally:
            self._busy = False
        self._published = offer
        _log.info("card_published", tasks=len(offer.tasks))

    def reset(self) -> None:
        """Publish again at the next check (a new relay connection: it may have lost it)."""
        self._published = None


def listener_card(
    *,
    load_inputs: Callable[[], AdmissionInputs],
    agent_kind: AgentKind | None,
    identity: Callable[[], IdentityKey],
    relay_origin: str,
    address: str,
    clock: IReactorTime,
    api: Callable[[], CardApi],
    connected: Callable[[], bool],
) -> CardPublisher:
    """The listener service's publisher: the card made from the files admission reads."""

    def make_offer() -> CardOffer:
        inputs = load_inputs()
        return card_offer(agent_kind, inputs.policy, inputs.ceiling, inputs.tasks)

    def sign(offer: CardOffer) -> SignedCardRecord:
        return sign_offer(offer, identity(), relay_origin, address, clock.seconds())

    return CardPublisher(make_offer=make_offer, sign=sign, api=api, connected=connected)
