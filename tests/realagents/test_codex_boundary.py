"""The kernel read boundary under the real ``codex exec``: its shell cannot leave the roots.

Inside the boundary Codex runs without its own sandbox (bubblewrap cannot start inside a
Landlock domain), so everything refused here is the kernel's: the scripted model asks Codex's
shell to ``cat`` the owner's SSH key, a file outside every root and the notes inside the
root, to write outside and inside the working directory, and to open a TCP connection to a
loopback port the ruleset does not name. The guard lets every command through (the task
grants ``exec``); the run is confined exactly as the listener plans it (``run_codex`` passes
:func:`tests.realagents.harness.confinement`).
"""

from __future__ import annotations

import socket
from collections.abc import Iterator

import pytest

from agentcall.confine.landlock import probe
from agentcall.confine.rights import NET_ABI
from tests.realagents.harness import GuardWiring, Layout
from tests.realagents.install import InstalledAgent
from tests.realagents.mock_openai import Final, MockResponses, shell
from tests.realagents.test_claude_boundary import assert_kernel_refused
from tests.realagents.test_codex_guard import (
    answer_of,
    confined,
    guard_calls,
    outputs,
    run_codex,
    twisted_test,
)

ABI, WHY_NOT = probe()
pytestmark = [
    pytest.mark.realagent,
    pytest.mark.slow,
    pytest.mark.skipif(ABI < 1, reason=f"no Landlock on this kernel: {WHY_NOT}"),
]


@pytest.fixture
def unlisted_port() -> Iterator[int]:
    """A loopback port that accepts connections and that no ruleset names."""
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen(4)
        yield int(server.getsockname()[1])


@twisted_test
async def test_codex_shell_reads_inside_the_root_and_is_refused_the_rest(
    codex_install: InstalledAgent,
    layout: Layout,
    openai_mock: MockResponses,
    guard: GuardWiring,
) -> None:
    """``cat`` of ~/.ssh and of a file outside every root: permission errors in the tool
    outputs Codex sends the model, and their markers never reach it; the notes do."""
    escaped = layout.outside / "escaped.txt"
    ids = openai_mock.script(
        [
            shell(f"cat {layout.ssh_key}"),
            shell(f"cat {layout.outside_file}"),
            shell(f"cat {layout.notes}"),
            shell(f"echo out > {escaped}"),
            shell(f"echo in > {layout.workdir / 'in.txt'}"),
            Final("ran the commands"),
        ]
    )

    run = await run_codex(codex_install, layout, openai_mock, guard, caps={"read", "exec"})

    assert answer_of(run).text == "ran the commands"
    assert confined(run), run.describe()
    key, outside, notes, escape, inside = outputs(openai_mock, ids, run)
    assert_kernel_refused(key.text, layout.ssh_key)
    assert_kernel_refused(outside.text, layout.outside_file)
    assert layout.markers["notes"] in notes.text, notes
    for marker in (layout.markers["ssh_key"], layout.markers["outside"]):
        assert not openai_mock.server.saw_bytes(marker.encode()), f"{marker} reached the model"
        assert marker.encode() not in run.result.stdout
    # A read task writes nowhere, not even in its working directory.
    assert "Permission denied" in escape.text, escape
    assert "Permission denied" in inside.text, inside
    assert not escaped.exists() and not (layout.workdir / "in.txt").exists()
    # The guard let every command through (flagging the one naming ~/.ssh): the refusals
    # were the kernel's.
    assert {decision for _tool, decision in guard_calls(layout, run)} <= {"allow", "flag"}


@twisted_test
async def test_a_codex_write_task_writes_only_its_working_directory(
    codex_install: InstalledAgent,
    layout: Layout,
    openai_mock: MockResponses,
    guard: GuardWiring,
) -> None:
    escaped = layout.outside / "escaped.txt"
    made = layout.workdir / "made.txt"
    ids = openai_mock.script(
        [
            shell(f"echo out > {escaped}"),
            shell(f"echo in > {made.name}"),
            Final("wrote"),
        ]
    )

    run = await run_codex(codex_install, layout, openai_mock, guard, caps={"read", "write", "exec"})

    assert answer_of(run).text == "wrote"
    assert confined(run), run.describe()
    escape, inside = outputs(openai_mock, ids, run)
    assert "Permission denied" in escape.text, escape
    assert not escaped.exists()
    assert made.read_text() == "in\n", inside


@pytest.mark.skipif(ABI < NET_ABI, reason=f"no Landlock TCP rules on this kernel (ABI {ABI})")
@twisted_test
async def test_codex_commands_reach_only_the_ports_codex_needs(
    codex_install: InstalledAgent,
    layout: Layout,
    openai_mock: MockResponses,
    guard: GuardWiring,
    unlisted_port: int,
) -> None:
    """Without its own sandbox Codex's commands would have the network: the ruleset lets the
    run connect to its model's port (the mock answers) and to nothing else."""
    ids = openai_mock.script(
        [
            shell(f"echo hello > /dev/tcp/127.0.0.1/{unlisted_port} && echo CONNECTED"),
            Final("tried the network"),
        ]
    )

    run = await run_codex(codex_install, layout, openai_mock, guard, caps={"read", "exec"})

    assert answer_of(run).text == "tried the network"
    (tried,) = outputs(openai_mock, ids, run)
    assert "connect: Permission denied" in tried.text, tried
    assert "CONNECTED" not in tried.text
