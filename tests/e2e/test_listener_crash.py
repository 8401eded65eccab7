"""A listener killed with `kill -9` mid-run leaves no agent behind (issue 25, item 5).

ken's fake agent first leaves detached children (as a Bash tool's `setsid sleep 600 &` would),
then holds until released. The test kills ken's listener with SIGKILL: the kernel kills the
agent at once (the exec wrapper's parent-death signal). The detached children outlive it, as
they would; the next listener to start kills them before it takes any work.
"""

from __future__ import annotations

import contextlib
import os
import select
import signal
from collections.abc import Iterator
from pathlib import Path

import pytest

from agentcall.confine.landlock import probe
from tests.e2e.installs import EVENT_WAIT_S, AgentGate, World, two_people

pytestmark = pytest.mark.e2e

ABI, WHY_NOT = probe()
if ABI < 1:
    pytest.skip(f"no Landlock on this kernel: {WHY_NOT}", allow_module_level=True)
if not hasattr(os, "pidfd_open"):
    pytest.skip("needs pidfd_open (Linux 5.3)", allow_module_level=True)


@pytest.fixture
def world(tmp_path: Path) -> Iterator[World]:
    with two_people(tmp_path) as world:
        yield world


def _ended(pid: int) -> bool:
    """Wait (bounded, on the event) for ``pid`` to end; False if it is still there."""
    try:
        watch = os.pidfd_open(pid)
    except ProcessLookupError:
        return True
    try:
        ready, _, _ = select.select([watch], [], [], EVENT_WAIT_S)
        return ready == [watch]
    finally:
        os.close(watch)


def test_a_killed_listener_takes_its_agent_along_and_its_successor_the_rest(
    world: World, tmp_path: Path
) -> None:
    ken = world.ken
    gate = AgentGate.make(tmp_path / "gate")
    ken.set_scenario({"name": "happy", "leave_children": True, "hold": gate.scenario()})
    listener = ken.start_listener()
    caller = world.ann.cli_async("call", "ken", "wait for me")
    children: list[int] = []
    try:
        gate.wait_started()
        agent = int(gate.started.read_text())
        children = ken.agent_children(agent)
        assert children, "the fake agent left no children to find"
        listener.process.send_signal(signal.SIGKILL)
        listener.process.wait(timeout=EVENT_WAIT_S)
        assert _ended(agent), "the agent outlived its listener"
        # What left the group survives the agent, as it would in life ...
        assert all(os.path.exists(f"/proc/{child}") for child in children)
        # ... until the next listener starts.
        ken.start_listener()
        assert ken.listener is not None
        ken.listener.log.wait_for(r"orphan_run_reaped")
        for child in children:
            assert _ended(child), f"the detached child {child} outlived the restart"
    finally:
        caller.kill()
        caller.communicate(timeout=EVENT_WAIT_S)
        for child in children:
            with contextlib.suppress(ProcessLookupError):
                os.kill(child, signal.SIGKILL)
