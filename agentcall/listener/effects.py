"""What the call pipeline does to the world, passed in as values (fakes in tests).

:class:`Effects` is the whole list; the protocols name the few shapes it needs of a running
agent, the agent spawner, the calls.log writer, and a mailbox job's frame sink.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable, Mapping
from typing import Protocol

import attrs
from twisted.internet import defer
from twisted.internet.interfaces import IReactorTime

from agentcall.confine.landlock import cached_abi
from agentcall.crypto.pins import PinBook
from agentcall.crypto.replay import ReplayWindow
from agentcall.listener import planning, stages
from agentcall.listener import prompt as prompt_module
from agentcall.listener.calllog import CallRecord
from agentcall.listener.contexts import Conversations
from agentcall.listener.runner import AgentRun, OutputParser, RunResult
from agentcall.wire.frames import Frame


class Cancellable(Protocol):
    """What the pipeline needs of a running agent (a :class:`~runner.RunHandle`)."""

    def cancel(self) -> None: ...


class CallSink(Protocol):
    """Where a mailbox job's frames go instead of the relay (see the mailbox desk)."""

    def frame(self, frame: Frame) -> None:
        """A frame the pipeline would have sent for a live call (progress or terminal)."""

    def agent_starting(self) -> None:
        """The agent is about to be spawned (never raises)."""

    def stopped(self) -> None:
        """The listener's shutdown cut the run: it ends with no answer, and may have acted
        (instead of a terminal frame; never raises)."""


class Spawner(Protocol):
    """Start one agent run; the Deferred fires with its result once the process is gone."""

    def __call__(
        self, run: AgentRun, parser: OutputParser
    ) -> tuple[defer.Deferred[RunResult], Cancellable]: ...


class CallLogWriter(Protocol):
    def append(self, record: CallRecord) -> bool: ...


def which_on_path(program: str, path: str) -> str | None:
    return shutil.which(program, path=path)


@attrs.define
class Effects:
    """Everything the pipeline does to the world, passed in (fakes in tests)."""

    clock: IReactorTime
    # Send one frame now; False when no usable relay connection exists.
    send: Callable[[Frame], bool]
    # The caller's published records, asked of the relay only when a call arrives without them
    # attached (an older relay); verified the same way in either case.
    fetch_keys: stages.KeyFetcher
    pins: PinBook
    replay: ReplayWindow
    load_admission: Callable[[], stages.AdmissionInputs]
    conversations: Conversations
    guard: planning.GuardSetup
    spawn: Spawner
    call_log: CallLogWriter
    environ: Mapping[str, str]
    which: planning.Which = which_on_path
    is_dir: Callable[[str], bool] = os.path.isdir
    build_prompt: planning.PromptBuilder = prompt_module.build_prompt
    # A request was sealed to an epoch this listener does not hold in memory: keys.json may
    # have a newer one (minted by a call this installation placed, or another process).
    keys_stale: Callable[[], None] = lambda: None
    # The kernel's Landlock ABI (0: none), which decides whether agents run confined.
    kernel_abi: Callable[[], int] = cached_abi
