"""The tool guard: real hook payloads through the decision, and the program as the CLIs run it.

The payload table starts from the captures in ``tests/fixtures/agent-clis`` (the real
PreToolUse stdin of Claude Code 2.1.332 and Codex 0.171, read at test time) and adds
hand-made payloads of the same shape for what the captures do not cover. A handful run through
the real program as a subprocess; the rest call it in-process.
"""

from __future__ import annotations

import io
import json
import os
import stat
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from agentcall.guard.decide import (
    ALLOW,
    DENY,
    FLAG,
    Decision,
    HookCall,
    PayloadError,
    Policy,
    decide,
    parse_payload,
    patch_paths,
)
from agentcall.guard.main import (
    DENY_OUTPUT,
    DENY_REASON,
    GuardConfigError,
    config_from_environ,
    main,
)
from agentcall.guard.scope import Scope
from agentcall.listener.guardwire import guard_argv, guard_env
from tests.hypothesis_profiles import examples
from tests.unit.agent_helpers import SAMPLES

ALL_CAPS = frozenset({"read", "write", "exec", "fetch"})


class Box:
    """A machine in a temp dir: home, a task workdir, something outside, the state dir."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.home = root / "home"
        self.workdir = self.home / "AgentCall" / "work" / "t1"
        self.scratch = root / "scratch"
        self.state = self.home / ".agentcall"
        self.tasks = self.home / "AgentCall" / "tasks"
        for d in (self.workdir, self.scratch, self.state, self.tasks, self.home / ".ssh"):
            d.mkdir(parents=True, exist_ok=True)
        (self.workdir / "notes.txt").write_text("notes")
        (self.workdir / ".env").write_text("TOKEN=x")
        (self.scratch / "hostname").write_text("vm")
        (self.workdir / "link_to_hostname").symlink_to(self.scratch / "hostname")
        (self.workdir / "link_to_key").symlink_to(self.home / ".ssh" / "id_ed25519")
        self.log = self.state / "tools.log"

    def subst(self, text: str) -> str:
        return (
            text.replace("$WORKDIR", str(self.workdir))
            .replace("$HOME", str(self.home))
            .replace("$SCRATCH", str(self.scratch))
        )

    def policy(self, caps: frozenset[str] = ALL_CAPS, roots: list[Path] | None = None) -> Policy:
        scope = Scope(
            [str(r) for r in (roots if roots is not None else [self.workdir])],
            [str(self.tasks)],
            str(self.home),
            case_insensitive=False,
        )
        return Policy(scope, caps, str(self.workdir) if "write" in caps else None)

    def env(self, caps: frozenset[str] = ALL_CAPS, mcp: tuple[str, ...] = ()) -> dict[str, str]:
        return {
            **guard_env(
                [str(self.workdir)],
                str(self.workdir) if "write" in caps else None,
                caps,
                "call-1",
                self.log,
                self.home,
                [str(self.tasks)],
                mcp_servers=mcp,
            ),
            "PATH": os.environ.get("PATH", ""),
        }

    def payload(self, tool: str, tool_input: dict[str, Any], **extra: Any) -> dict[str, Any]:
        return {
            "session_id": "a5b1ff81-8731-4e5a-9d3b-8b0c301a5fb4",
            "transcript_path": f"{self.home}/.claude/projects/-x/a5b1.jsonl",
            "cwd": str(self.workdir),
            "prompt_id": "97503092-345e-4acf-abf2-6358a285695e",
            "permission_mode": "dontAsk",
            "effort": {"level": "medium"},
            "hook_event_name": "PreToolUse",
            "tool_name": tool,
            "tool_input": tool_input,
            "tool_use_id": f"toolu_{tool}_{len(json.dumps(tool_input))}",
            **extra,
        }


@pytest.fixture
def box(tmp_path: Path) -> Box:
    return Box(tmp_path)


def judge(box: Box, payload: dict[str, Any], caps: frozenset[str] = ALL_CAPS) -> Decision:
    return decide(parse_payload(payload, "/"), box.policy(caps))


# --- the captured payloads -------------------------------------------------------------------

# (line of claude-pretooluse-hook-stdin.jsonl, caps, expected) — the read task's rows first.
CLAUDE_SAMPLE_TABLE = [
    (0, {"read"}, Decision(ALLOW, "inside-read-roots")),
    (1, {"read"}, Decision(DENY, "outside-read-roots")),
    (2, {"read"}, Decision(ALLOW, "inside-read-roots")),
    (3, {"read"}, Decision(DENY, "outside-read-roots")),
    (4, {"read"}, Decision(DENY, "denied-name")),
    (5, {"read", "write"}, Decision(DENY, "outside-read-roots")),
    (6, {"read", "write"}, Decision(DENY, "outside-read-roots")),
    (7, {"read", "write"}, Decision(ALLOW, "inside-write-root")),
    (7, {"read"}, Decision(DENY, "no-write-capability")),
    (8, {"read", "write"}, Decision(ALLOW, "inside-write-root")),
    (9, {"read", "exec"}, Decision(ALLOW, "bash-recorded")),
    (9, {"read"}, Decision(DENY, "no-exec-capability")),
    (10, {"read", "exec"}, Decision(ALLOW, "bash-recorded")),
    (11, {"read", "exec"}, Decision(ALLOW, "bash-recorded")),
    (12, {"read", "exec"}, Decision(ALLOW, "bash-recorded")),
    (13, {"read", "fetch"}, Decision(ALLOW, "fetch-granted")),
    (13, {"read"}, Decision(DENY, "no-fetch-capability")),
    (14, {"read", "fetch"}, Decision(ALLOW, "fetch-granted")),
    (14, {"read", "exec"}, Decision(DENY, "no-fetch-capability")),
]
CODEX_SAMPLE_TABLE = [
    (0, {"read", "exec"}, Decision(ALLOW, "bash-recorded")),
    (0, {"read"}, Decision(DENY, "no-exec-capability")),
    (1, {"read", "write"}, Decision(ALLOW, "inside-write-root")),
    (1, {"read", "exec"}, Decision(DENY, "no-write-capability")),
    (3, {"read", "write"}, Decision(DENY, "outside-write-root")),
]


def sample_payloads(box: Box, name: str) -> list[dict[str, Any]]:
    text = (SAMPLES / name).read_text(encoding="utf-8")
    return [json.loads(box.subst(line)) for line in text.splitlines() if line.strip()]


@pytest.mark.parametrize(("index", "caps", "expected"), CLAUDE_SAMPLE_TABLE)
def test_claude_captured_payloads(box: Box, index: int, caps: set[str], expected: Decision) -> None:
    """Every captured Claude payload gets the verdict its task's capabilities call for."""
    payload = sample_payloads(box, "claude-pretooluse-hook-stdin.jsonl")[index]
    assert judge(box, payload, frozenset(caps)) == expected


@pytest.mark.parametrize(("index", "caps", "expected"), CODEX_SAMPLE_TABLE)
def test_codex_captured_payloads(box: Box, index: int, caps: set[str], expected: Decision) -> None:
    """Codex Bash and apply_patch payloads: the patch's own paths decide."""
    payload = sample_payloads(box, "codex-pretooluse-hook-stdin.jsonl")[index]
    assert judge(box, payload, frozenset(caps)) == expected


# --- the same shapes, for what the captures do not cover -------------------------------------

R = frozenset({"read"})
RW = frozenset({"read", "write"})
RX = frozenset({"read", "exec"})
W = frozenset({"write"})
F = frozenset({"fetch"})


def allow(rule: str) -> Decision:
    return Decision(ALLOW, rule)


def deny(rule: str) -> Decision:
    return Decision(DENY, rule)


PATCH_OK = "*** Begin Patch\n*** Update File: a.txt\n@@\n-x\n+y\n*** End Patch\n"
PATCH_MOVE = "*** Begin Patch\n*** Update File: a.txt\n*** Move to: ~/.zshrc\n*** End Patch"
PATCH_CLIMB = "*** Begin Patch\n*** Delete File: ../../../.ssh/authorized_keys\n*** End Patch"
PATCH_MIXED = "*** Add File: ok.txt\n+x\n*** Add File: $SCRATCH/no.txt\n+y\n*** End Patch"
TOO_MANY = "{a,b}{c,d}{e,f}{g,h}{i,j}{k,l}{m,n}"
WD = "$WORKDIR"
TABLE: list[tuple[str, dict[str, Any], frozenset[str], Decision]] = [
    ("Read", {"file_path": f"{WD}/link_to_key"}, R, deny("denied-home-path")),
    ("Read", {"file_path": "$HOME/.ssh/id_ed25519"}, R, deny("denied-home-path")),
    ("Read", {"file_path": "~/.ssh/id_ed25519"}, R, deny("denied-home-path")),
    ("Read", {"file_path": f"{WD}/.env.example"}, R, allow("inside-read-roots")),
    ("Read", {"file_path": "notes.txt", "offset": 1, "limit": 5}, R, allow("inside-read-roots")),
    ("Read", {"file_path": f"{WD}/../t2/x"}, R, deny("outside-read-roots")),
    ("Read", {"file_path": "$HOME/AgentCall/tasks/ask/SKILL.md"}, R, deny("denied-root")),
    ("Read", {"file_path": "$HOME/.agentcall/tools.log"}, R, deny("denied-home-path")),
    ("Read", {}, R, deny("unparseable-target")),
    ("Read", {"file_path": 7}, R, deny("unparseable-target")),
    ("Read", {"file_path": "a\u0000b"}, R, deny("unparseable-target")),
    ("Read", {"file_path": f"{WD}/notes.txt"}, W, deny("no-read-capability")),
    ("Write", {"file_path": f"{WD}/.env", "content": "x"}, RW, deny("denied-name")),
    ("Write", {"file_path": "$HOME/.bashrc", "content": "x"}, RW, deny("denied-home-path")),
    ("Write", {"file_path": "$SCRATCH/x", "content": "x"}, RW, deny("outside-write-root")),
    ("MultiEdit", {"file_path": f"{WD}/a.py", "edits": []}, RW, allow("inside-write-root")),
    ("NotebookEdit", {"notebook_path": f"{WD}/n.ipynb"}, RW, allow("inside-write-root")),
    ("NotebookEdit", {"notebook_path": "$SCRATCH/n.ipynb"}, RW, deny("outside-write-root")),
    ("NotebookEdit", {"notebook_path": f"{WD}/n.ipynb"}, R, deny("no-write-capability")),
    ("Glob", {"pattern": "**/*.py", "path": WD}, R, allow("inside-read-roots")),
    ("Glob", {"pattern": "src/**/*.py"}, R, allow("inside-read-roots")),
    ("Glob", {"pattern": "*"}, R, allow("inside-read-roots")),
    ("Glob", {"pattern": "**/*", "path": "$HOME"}, R, deny("outside-read-roots")),
    ("Glob", {"pattern": "../*"}, R, deny("selector-climbs")),
    ("Glob", {"pattern": "a/{b,..}/c"}, R, deny("selector-climbs")),
    ("Glob", {"pattern": "**/.env*"}, R, deny("selector-names-denied")),
    ("Glob", {"pattern": "**/*.pem"}, R, deny("selector-names-denied")),
    ("Glob", {"pattern": "**/*.{py,key}"}, R, deny("selector-names-denied")),
    ("Glob", {"pattern": "**/id_*"}, R, deny("selector-names-denied")),
    ("Glob", {"pattern": "**/?env"}, R, deny("selector-names-denied")),
    ("Glob", {"pattern": "/etc/**"}, R, deny("outside-read-roots")),
    ("Glob", {"pattern": "~/.ssh/*"}, R, deny("denied-home-path")),
    ("Glob", {"pattern": "link_to_hostname"}, R, deny("outside-read-roots")),
    ("Glob", {"pattern": TOO_MANY}, R, deny("selector-too-complex")),
    ("Glob", {"path": WD}, R, deny("unparseable-selector")),
    ("Glob", {"pattern": 3}, R, deny("unparseable-selector")),
    ("Glob", {"pattern": "*", "path": ["x"]}, R, deny("unparseable-target")),
    ("Glob", {"pattern": "*"}, W, deny("no-read-capability")),
    ("Grep", {"pattern": "TODO", "glob": "*.py"}, R, allow("inside-read-roots")),
    ("Grep", {"pattern": "TODO", "path": f"{WD}/.env"}, R, deny("denied-name")),
    ("Grep", {"pattern": "TODO", "glob": "**/*.key"}, R, deny("selector-names-denied")),
    ("Grep", {"pattern": "TODO", "glob": 5}, R, deny("unparseable-selector")),
    ("Grep", {"glob": "*.py"}, R, deny("unparseable-selector")),
    ("Bash", {"command": "cat ~/.ssh/id_ed25519"}, RX, Decision(FLAG, "bash-mentions-denied-path")),
    ("Bash", {"command": "cat .env"}, RX, Decision(FLAG, "bash-mentions-denied-path")),
    ("Bash", {"command": ["ls"]}, RX, deny("unparseable-command")),
    ("WebFetch", {"url": "file:///etc/passwd", "prompt": "x"}, F, deny("unparseable-url")),
    ("WebFetch", {"url": "http://", "prompt": "x"}, F, deny("unparseable-url")),
    ("WebFetch", {"url": "HTTP://Example.com/a", "prompt": "x"}, F, allow("fetch-granted")),
    ("WebFetch", {"prompt": "x"}, F, deny("unparseable-url")),
    ("apply_patch", {"command": PATCH_OK}, W, allow("inside-write-root")),
    ("apply_patch", {"command": PATCH_MOVE}, W, deny("denied-home-path")),
    ("apply_patch", {"command": PATCH_CLIMB}, W, deny("denied-home-path")),
    ("apply_patch", {"command": PATCH_MIXED}, W, deny("outside-write-root")),
    ("apply_patch", {"command": "echo hi"}, W, deny("unparseable-patch")),
    ("apply_patch", {"command": "*** Add File: \n"}, W, deny("unparseable-patch")),
    ("apply_patch", {"command": PATCH_OK}, RX, deny("no-write-capability")),
    ("Task", {"prompt": "x", "description": "y"}, ALL_CAPS, deny("unclassified-tool")),
    ("mcp__github__get_file", {"path": "x"}, ALL_CAPS, deny("connector-not-granted")),
    ("LS", {"path": WD}, ALL_CAPS, deny("unclassified-tool")),
]


@pytest.mark.parametrize(("tool", "tool_input", "caps", "expected"), TABLE)
def test_decision_table(
    box: Box, tool: str, tool_input: dict[str, Any], caps: frozenset[str], expected: Decision
) -> None:
    """Hand-made payloads of the captured shape: each tool's rule, capability and escape."""
    concrete = json.loads(box.subst(json.dumps(tool_input)))
    assert judge(box, box.payload(tool, concrete), caps) == expected


def test_glob_over_home_is_refused_even_when_home_is_a_root(box: Box) -> None:
    """The ask task reads all of home, but a search from home would walk into ~/.ssh."""
    policy = box.policy(frozenset({"read"}), roots=[box.home])
    for tool_input in ({"pattern": "**/*", "path": str(box.home)}, {"pattern": "~/**"}):
        call = parse_payload(box.payload("Glob", tool_input), "/")
        assert decide(call, policy) == Decision(DENY, "search-covers-denied-path")
    # With cwd = home and no path: the cwd is the search root.
    call = parse_payload(box.payload("Grep", {"pattern": "x"}, cwd=str(box.home)), "/")
    assert decide(call, policy) == Decision(DENY, "search-covers-denied-path")
    call = parse_payload(box.payload("Glob", {"pattern": "*.md"}), "/")
    assert decide(call, policy) == Decision(ALLOW, "inside-read-roots")


@pytest.mark.parametrize(
    "bad",
    [
        [],
        "text",
        {"hook_event_name": "PostToolUse", "tool_name": "Read", "tool_input": {}},
        {"tool_name": "Read", "tool_input": {}},
        {"hook_event_name": "PreToolUse", "tool_input": {}},
        {"hook_event_name": "PreToolUse", "tool_name": "", "tool_input": {}},
        {"hook_event_name": "PreToolUse", "tool_name": "Read", "tool_input": "x"},
        {"hook_event_name": "PreToolUse", "tool_name": "Read", "tool_input": {}, "cwd": "rel"},
        {"hook_event_name": "PreToolUse", "tool_name": "Read", "tool_input": {}, "cwd": 1},
        {
            "hook_event_name": "PreToolUse",
            "tool_name": "Read",
            "tool_input": {},
            "tool_use_id": 5,
        },
    ],
)
def test_parse_payload_refuses_what_is_not_a_pretooluse_call(bad: object) -> None:
    """The envelope must be a PreToolUse payload; anything else cannot be judged."""
    with pytest.raises(PayloadError):
        parse_payload(bad, "/")


def test_parse_payload_without_cwd_uses_the_process_cwd() -> None:
    """The hook runs in the session cwd, so that is where relative paths start."""
    call = parse_payload(
        {"hook_event_name": "PreToolUse", "tool_name": "Read", "tool_input": {}}, "/srv"
    )
    assert isinstance(call, HookCall)
    assert (call.cwd, call.tool_use_id) == ("/srv", None)


def test_patch_paths() -> None:
    """Add, Update, Delete and Move-to lines, in order; hunks are not paths."""
    patch = (
        "*** Begin Patch\n*** Add File: a.txt\n+*** Add File: not-a-path\n"
        "*** Update File: src/b.py\n*** Move to: src/c.py\n@@\n-x\n+y\n"
        "*** Delete File: old.txt\n*** End Patch\n"
    )
    assert patch_paths(patch) == ["a.txt", "src/b.py", "src/c.py", "old.txt"]


# --- the program, in-process -----------------------------------------------------------------


# --- connectors: the task's MCP servers ----------------------------------------------------

MCP_GRANTED = frozenset({"github", "my_docs", "git"})


@pytest.mark.parametrize(
    ("tool", "expected"),
    [
        ("mcp__github__get_file", allow("connector-granted")),
        ("mcp__git__log", allow("connector-granted")),
        ("mcp__my_docs__search", allow("connector-granted")),
        ("mcp__slack__post_message", deny("connector-not-granted")),
        # A granted name is a whole server name, never a prefix of another one.
        ("mcp__gitlab__get_file", deny("connector-not-granted")),
        ("mcp__githubx__get_file", deny("connector-not-granted")),
        ("mcp__GitHub__get_file", deny("connector-not-granted")),
        ("mcp__github__", deny("connector-not-granted")),
        ("mcp__github", deny("connector-not-granted")),
        ("mcp____get_file", deny("connector-not-granted")),
        ("mcp_github__get_file", deny("unclassified-tool")),
    ],
)
def test_mcp_tools_only_of_the_granted_servers(box: Box, tool: str, expected: Decision) -> None:
    """mcp__<server>__<tool> passes for the task's connectors alone, whatever the caps."""
    scope = box.policy().scope
    payload = parse_payload(box.payload(tool, {"path": "x"}), "/")
    for caps in (ALL_CAPS, frozenset()):
        assert decide(payload, Policy(scope, caps, None, MCP_GRANTED)) == expected
    # Without connectors, no MCP tool at all.
    assert decide(payload, Policy(scope, ALL_CAPS, None)).action == DENY


def test_program_allows_a_granted_connector_and_logs_which(box: Box) -> None:
    """Allowed silently with the connector on the log line; another server is refused."""
    env = box.env(mcp=("github", "docs.internal"))
    assert env["AGENTCALL_GUARD_MCP"] == "docs_internal,github"
    granted = box.payload("mcp__github__get_file", {"owner": "acme", "repo": "x"})
    assert run_main(env, json.dumps(granted).encode()) == (0, "", "")
    dotted = box.payload("mcp__docs_internal__search", {"query": "q"})
    assert run_main(env, json.dumps(dotted).encode()) == (0, "", "")
    other = box.payload("mcp__slack__post_message", {"text": "hi"})
    assert run_main(env, json.dumps(other).encode()) == (0, DENY_OUTPUT + "\n", "")
    first, second, third = log_lines(box)
    assert (first["decision"], first["rule"], first["connector"]) == (
        "allow",
        "connector-granted",
        "github",
    )
    assert (second["decision"], second["connector"]) == ("allow", "docs_internal")
    assert (third["decision"], third["rule"]) == ("deny", "connector-not-granted")
    assert "connector" not in third
    assert third["tool"] == "mcp__slack__post_message"


def test_program_without_connectors_refuses_every_mcp_tool(box: Box) -> None:
    env = box.env()
    assert env["AGENTCALL_GUARD_MCP"] == ""
    payload = box.payload("mcp__github__get_file", {"path": "x"})
    assert run_main(env, json.dumps(payload).encode()) == (0, DENY_OUTPUT + "\n", "")
    del env["AGENTCALL_GUARD_MCP"]
    assert run_main(env, json.dumps(payload).encode()) == (0, DENY_OUTPUT + "\n", "")
    assert [e["rule"] for e in log_lines(box)] == ["connector-not-granted"] * 2


@pytest.mark.parametrize("value", ["git hub", "a,b c", "../x", "_x", "x.y", "é"])
def test_program_refuses_a_malformed_connector_list(box: Box, value: str) -> None:
    """A server list the guard cannot read exactly is a configuration error: exit 2."""
    env = {**box.env(), "AGENTCALL_GUARD_MCP": value}
    with pytest.raises(GuardConfigError):
        config_from_environ(env)
    payload = box.payload("mcp__github__get_file", {"path": "x"})
    code, out, err = run_main(env, json.dumps(payload).encode())
    assert (code, out) == (2, "")
    assert "AGENTCALL_GUARD_MCP" in err


def run_main(env: dict[str, str], stdin: bytes) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    code = main([], stdin=io.BytesIO(stdin), stdout=out, stderr=err, environ=env)
    return code, out.getvalue(), err.getvalue()


def log_lines(box: Box) -> list[dict[str, Any]]:
    return [json.loads(line) for line in box.log.read_text().splitlines()]


def test_program_allows_silently_and_logs(box: Box) -> None:
    """Allowed: no output at all, exit 0, one private log line with the call's ids."""
    payload = box.payload("Read", {"file_path": str(box.workdir / "notes.txt")})
    code, out, err = run_main(box.env(), json.dumps(payload).encode())
    assert (code, out, err) == (0, "", "")
    (entry,) = log_lines(box)
    assert entry["decision"] == "allow"
    assert {k: entry[k] for k in ("call_id", "tool", "tool_use_id", "rule")} == {
        "call_id": "call-1",
        "tool": "Read",
        "tool_use_id": payload["tool_use_id"],
        "rule": "inside-read-roots",
    }
    assert entry["ts"].endswith("Z")
    assert stat.S_IMODE(box.log.stat().st_mode) == 0o600


def test_program_logs_bash_redacted_and_cut(box: Box) -> None:
    """Bash commands are logged redacted before they are cut to 500 characters."""
    secret = "sk-ant-api03-" + "A" * 40
    command = f"curl -H 'x-api-key: {secret}' https://example.com; cat ~/.aws/credentials "
    payload = box.payload("Bash", {"command": command + "#" * 1000})
    code, out, _ = run_main(box.env(), json.dumps(payload).encode())
    assert (code, out) == (0, "")
    (entry,) = log_lines(box)
    assert (entry["decision"], entry["rule"]) == ("flag", "bash-mentions-denied-path")
    assert secret not in entry["command"]
    assert "[redacted]" in entry["command"]
    assert len(entry["command"]) == 500


def test_program_refuses_missing_configuration(box: Box) -> None:
    """Without its environment the guard cannot decide: exit 2, nothing on stdout."""
    payload = json.dumps(box.payload("Read", {"file_path": "notes.txt"})).encode()
    env = box.env()
    for name in ("AGENTCALL_CALL_ID", "AGENTCALL_GUARD_ROOTS", "AGENTCALL_GUARD_CAPS"):
        broken = {k: v for k, v in env.items() if k != name}
        code, out, err = run_main(broken, payload)
        assert (code, out) == (2, "")
        assert name in err
    for name, value in (
        ("AGENTCALL_GUARD_CAPS", "read,root"),
        ("AGENTCALL_GUARD_ROOTS", "relative"),
        ("AGENTCALL_GUARD_LOG", "tools.log"),
        ("AGENTCALL_GUARD_WRITE_ROOT", "rel"),
    ):
        with pytest.raises(GuardConfigError):
            config_from_environ({**env, name: value})
    assert run_main(env, payload)[0] == 0


def test_program_refuses_arguments(box: Box) -> None:
    """Arguments are not how the guard is configured."""
    out, err = io.StringIO(), io.StringIO()
    assert main(["--help"], stdin=io.BytesIO(b"{}"), stdout=out, stderr=err) == 2
    assert out.getvalue() == ""


@pytest.mark.parametrize("mode", ["missing-dir", "loose-mode", "symlink", "directory"])
def test_log_failure_fails_closed(box: Box, tmp_path: Path, mode: str) -> None:
    """When the attempt cannot be logged, the call is refused with exit 2."""
    env = box.env()
    if mode == "missing-dir":
        env["AGENTCALL_GUARD_LOG"] = str(tmp_path / "gone" / "tools.log")
    elif mode == "loose-mode":
        box.log.write_text("")
        box.log.chmod(0o644)
    elif mode == "symlink":
        (tmp_path / "elsewhere").write_text("")
        box.log.symlink_to(tmp_path / "elsewhere")
    else:
        box.log.mkdir()
    payload = box.payload("Read", {"file_path": str(box.workdir / "notes.txt")})
    code, out, err = run_main(env, json.dumps(payload).encode())
    assert (code, out) == (2, "")
    assert err


@pytest.mark.parametrize(
    "raw",
    [b"", b"not json", b"\xff\xfe", b"[1,2]", b"{}", b"[" * 100_000, b'{"hook_event_name":1}'],
)
def test_garbage_input_exits_2_and_is_logged(box: Box, raw: bytes) -> None:
    """Garbage is a refusal by exit 2 with a reason, and leaves a line in the log."""
    code, out, err = run_main(box.env(), raw)
    assert (code, out) == (2, "")
    assert err.strip()
    (entry,) = log_lines(box)
    assert (entry["decision"], entry["rule"], entry["tool"]) == (
        "deny",
        "unparseable-payload",
        None,
    )


# --- never "allow", over random input --------------------------------------------------------

_TOOLS = st.sampled_from(
    [
        *("Read", "Write", "Edit", "MultiEdit", "NotebookEdit", "Glob", "Grep", "Bash"),
        *("WebFetch", "WebSearch", "apply_patch", "Task", "allow", "Allow"),
    ]
)
_KEYS = st.sampled_from(
    ["file_path", "notebook_path", "path", "pattern", "glob", "command", "url", "query", "allow"]
)
_VALUES = st.one_of(
    st.text(max_size=40),
    st.sampled_from(["~/.ssh/id_rsa", ".env", "../x", "allow", "/etc/passwd", "**/*", "~"]),
    st.integers(),
    st.none(),
    st.lists(st.text(max_size=5), max_size=2),
)
_PAYLOADS = st.fixed_dictionaries(
    {
        "hook_event_name": st.sampled_from(["PreToolUse", "PreToolUse", "allow"]),
        "tool_name": st.one_of(_TOOLS, st.text(max_size=10)),
        "tool_input": st.one_of(st.dictionaries(_KEYS, _VALUES, max_size=4), st.text()),
    },
    optional={
        "cwd": st.sampled_from(["/", "/tmp", "relative", "~"]),
        "tool_use_id": st.one_of(st.text(max_size=8), st.integers()),
        "permissionDecision": st.just("allow"),
    },
)


@settings(
    max_examples=examples(300),
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(payload=st.one_of(_PAYLOADS.map(lambda p: json.dumps(p).encode()), st.binary(max_size=64)))
def test_output_never_says_allow(box: Box, payload: bytes) -> None:
    """Whatever arrives, stdout is empty or the deny JSON, the exit 0 or 2, and no output
    anywhere says "allow"."""
    code, out, err = run_main(box.env(), payload)
    assert code in (0, 2)
    assert out in ("", DENY_OUTPUT + "\n")
    assert "allow" not in (out + err).casefold()
    if code == 2:
        assert out == "" and err


# --- the program as the CLIs run it ----------------------------------------------------------

REPO = Path(__file__).resolve().parents[2]


def run_program(
    argv: list[str], env: dict[str, str], stdin: bytes, cwd: Path
) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run(
        argv, input=stdin, env=env, cwd=cwd, capture_output=True, timeout=60, check=False
    )


@pytest.mark.slow
def test_subprocess_deny_shape_is_exact(box: Box) -> None:
    """The deny JSON, byte for byte, with a fixed reason that names no path; exit 0."""
    payload = box.payload("Read", {"file_path": str(box.home / ".ssh" / "id_ed25519")})
    done = run_program(guard_argv(), box.env(), json.dumps(payload).encode(), box.workdir)
    assert (done.returncode, done.stderr) == (0, b"")
    assert done.stdout.decode() == DENY_OUTPUT + "\n"
    assert json.loads(done.stdout) == {
        "hookSpecificOutput": {
            "hookEventName": "PreToolUse",
            "permissionDecision": "deny",
            "permissionDecisionReason": DENY_REASON,
        }
    }
    assert ".ssh" not in DENY_REASON and "/" not in DENY_REASON
    (entry,) = log_lines(box)
    assert (entry["decision"], entry["rule"]) == ("deny", "denied-home-path")
    assert stat.S_IMODE(box.log.stat().st_mode) == 0o600


@pytest.mark.slow
def test_subprocess_allow_and_garbage(box: Box) -> None:
    """Allowed: empty stdout, exit 0. Garbage: exit 2 and a reason on stderr (Codex needs one)."""
    payload = box.payload("Read", {"file_path": "notes.txt"})
    done = run_program(guard_argv(), box.env(), json.dumps(payload).encode(), box.workdir)
    assert (done.returncode, done.stdout, done.stderr) == (0, b"", b"")
    done = run_program(guard_argv(), box.env(), b"{not json", box.workdir)
    assert (done.returncode, done.stdout) == (2, b"")
    assert b"could not be checked" in done.stderr


@pytest.mark.slow
def test_subprocess_crash_fails_closed_without_leaking(box: Box) -> None:
    """An exception inside the decision is exit 2; its message (a path) is not echoed."""
    code = (
        "import sys\n"
        "import agentcall.guard.main as m\n"
        "def boom(*a, **k):\n"
        "    raise RuntimeError('/home/secret/path')\n"
        "m.decide = boom\n"
        "sys.exit(m.main())\n"
    )
    payload = box.payload("Read", {"file_path": "notes.txt"})
    argv = [sys.executable, "-I", "-c", code]
    done = run_program(argv, box.env(), json.dumps(payload).encode(), box.workdir)
    assert (done.returncode, done.stdout) == (2, b"")
    assert b"RuntimeError" in done.stderr
    assert b"/home/secret/path" not in done.stderr


@pytest.mark.slow
def test_console_script_runs_the_guard(box: Box) -> None:
    """``agentcall guard`` (the console script) behaves as ``python -m agentcall.guard``."""
    script = Path(sys.executable).parent / "agentcall"
    if not script.exists():
        pytest.skip("the agentcall console script is not installed next to this python")
    payload = box.payload("Read", {"file_path": str(box.workdir / ".env")})
    done = run_program([str(script), "guard"], box.env(), json.dumps(payload).encode(), box.workdir)
    assert (done.returncode, done.stdout.decode()) == (0, DENY_OUTPUT + "\n")


@pytest.mark.slow
def test_start_up_imports_stay_small(box: Box) -> None:
    """No Twisted, autobahn, crypto, attrs or argparse on either start-up path, even after
    a Bash call pulls in redaction."""
    heavy = ("twisted", "autobahn", "nacl", "cryptography", "attr", "attrs", "zope", "argparse")
    probe = (
        "import io, json, sys\n"
        "from agentcall.cli.main import main\n"
        f"payload = {json.dumps(json.dumps(box.payload('Bash', {'command': 'ls'})))}\n"
        "sys.stdin = io.TextIOWrapper(io.BytesIO(payload.encode()))\n"
        "code = main(['guard'])\n"
        f"heavy = {heavy!r}\n"
        "print(json.dumps([code, sorted(m for m in sys.modules if m.split('.')[0] in heavy)]))\n"
    )
    done = run_program([sys.executable, "-I", "-c", probe], box.env(), b"", box.workdir)
    assert json.loads(done.stdout) == [0, []], done.stderr
