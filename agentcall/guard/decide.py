"""The tool guard's decision for one PreToolUse payload: allow, deny or flag, and why.

Pure apart from path resolution on disk (symlinks are followed before any comparison). What
each tool is held to:

- ``Read`` (``file_path``): not denied, inside a read root.
- ``Write``/``Edit``/``MultiEdit`` (``file_path``), ``NotebookEdit`` (``notebook_path``) and
  Codex ``apply_patch`` (the paths named in the patch text): the write capability, not denied,
  inside the write root.
- ``Glob``/``Grep``: the search root (``path``, else the session cwd) must be readable and
  must not contain a denied home path or root; the selector (Glob ``pattern``, Grep ``glob``)
  must not climb with ``..``, name a credential file, or start outside the roots. A recursive
  search inside an allowed root can still reach a ``.env`` or key file lying there (Grep then
  prints its matching lines): denied *names* cannot be enforced without listing the tree.
- ``Bash``: the exec capability only. **Bash is not bounded**: a shell reads and writes
  whatever the user can. It is recorded, and flagged when it names a denied path.
- ``WebFetch`` (``http``/``https`` URLs only) and ``WebSearch``: the fetch capability.
- ``mcp__<server>__<tool>``: only for the servers the task names (its connectors, the
  normalized names in ``Policy.mcp_servers``); every other MCP tool is denied. What an MCP
  tool does is up to its server: the guard records the call, it cannot bound it.
- Any other tool, including sub-agents: denied.
"""

from __future__ import annotations

import fnmatch
import os
import re

from agentcall.guard.scope import Scope, ScopeError, Verdict, is_denied_name

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Iterable, Mapping

ALLOW = "allow"
DENY = "deny"
FLAG = "flag"
CAPABILITIES = frozenset({"read", "write", "fetch", "exec"})

READ_TOOLS = {"Read": "file_path"}
WRITE_TOOLS = {
    "Write": "file_path",
    "Edit": "file_path",
    "MultiEdit": "file_path",
    "NotebookEdit": "notebook_path",
}
# Codex's patch format names every file it touches on one of these lines.
_PATCH_TARGET = re.compile(
    r"^\s*\*\*\* (?:Add File|Update File|Delete File|Move to):[ \t]*(.*?)\s*$"
)
_BRACES = re.compile(r"\{([^{}]*)\}")
_MAX_ALTERNATIVES = 64
_GLOB_CHARS = frozenset("*?[{")
# Credential names a selector must not be able to match; a component made only of stars is
# let through (it matches these too, but refusing it would refuse every listing).
_SECRET_SAMPLES = (
    ".env",
    ".env.local",
    "id_rsa",
    "id_ed25519",
    "id_ecdsa",
    "id_dsa",
    "server.pem",
    "server.key",
    "cert.p12",
    "cert.pfx",
)


class PayloadError(ValueError):
    """The hook input is not a PreToolUse payload the guard can judge."""


class HookCall:
    """The parts of a PreToolUse payload the decision uses."""

    __slots__ = ("cwd", "tool_input", "tool_name", "tool_use_id")

    def __init__(
        self, tool_name: str, tool_input: Mapping[str, object], cwd: str, tool_use_id: str | None
    ) -> None:
        self.tool_name = tool_name
        self.tool_input = tool_input
        self.cwd = cwd
        self.tool_use_id = tool_use_id


class Policy:
    """One run's configuration: the scope, the granted capabilities and the write root."""

    __slots__ = ("caps", "mcp_servers", "scope", "write_root")

    def __init__(
        self,
        scope: Scope,
        caps: Iterable[str],
        write_root: str | None,
        mcp_servers: Iterable[str] = (),
    ) -> None:
        self.scope = scope
        self.caps = frozenset(caps)
        self.write_root = write_root or None
        # Server names as they appear in tool names (see connectors.tool_name_part).
        self.mcp_servers = frozenset(mcp_servers)


class Decision:
    """``action`` is ``allow``, ``deny`` or ``flag`` (let through, but worth a look)."""

    __slots__ = ("action", "rule")

    def __init__(self, action: str, rule: str) -> None:
        self.action = action
        self.rule = rule

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Decision):
            return NotImplemented
        return (self.action, self.rule) == (other.action, other.rule)

    def __hash__(self) -> int:
        return hash((self.action, self.rule))

    def __repr__(self) -> str:
        return f"Decision({self.action!r}, {self.rule!r})"


def parse_payload(value: object, fallback_cwd: str) -> HookCall:
    """Check the decoded hook JSON; anything that is not a PreToolUse call raises."""
    if not isinstance(value, dict):
        raise PayloadError("the hook input is not a JSON object")
    if value.get("hook_event_name") != "PreToolUse":
        raise PayloadError("the hook input is not a PreToolUse event")
    tool_name = value.get("tool_name")
    if not isinstance(tool_name, str) or not tool_name:
        raise PayloadError("the hook input names no tool")
    tool_input = value.get("tool_input")
    if not isinstance(tool_input, dict):
        raise PayloadError("the hook input has no tool_input object")
    cwd = value.get("cwd", fallback_cwd)
    if not isinstance(cwd, str) or not os.path.isabs(cwd) or "\0" in cwd:
        raise PayloadError("the hook input has no absolute cwd")
    tool_use_id = value.get("tool_use_id")
    if tool_use_id is not None and not isinstance(tool_use_id, str):
        raise PayloadError("the hook input has a malformed tool_use_id")
    return HookCall(tool_name, tool_input, cwd, tool_use_id)


MCP_PREFIX = "mcp__"


def mcp_server_of(tool_name: str, servers: Iterable[str]) -> str | None:
    """The granted server an ``mcp__<server>__<tool>`` name belongs to, or None."""
    if not tool_name.startswith(MCP_PREFIX):
        return None
    rest = tool_name[len(MCP_PREFIX) :]
    for server in sorted(servers, key=len, reverse=True):
        if server and rest.startswith(server + "__") and len(rest) > len(server) + 2:
            return server
    return None


def decide(call: HookCall, policy: Policy) -> Decision:
    """The verdict on one tool call. Unknown tools and malformed inputs are denied."""
    try:
        return _decide(call, policy)
    except ScopeError:
        return Decision(DENY, "unparseable-target")


def _decide(call: HookCall, policy: Policy) -> Decision:
    name = call.tool_name
    if name in READ_TOOLS:
        if "read" not in policy.caps:
            return Decision(DENY, "no-read-capability")
        target = _text(call.tool_input, READ_TOOLS[name])
        return _from_verdict(policy.scope.check_read(target, call.cwd))
    if name in WRITE_TOOLS:
        if "write" not in policy.caps:
            return Decision(DENY, "no-write-capability")
        target = _text(call.tool_input, WRITE_TOOLS[name])
        return _from_verdict(policy.scope.check_write(target, policy.write_root, call.cwd))
    if name == "apply_patch":
        return _apply_patch(call, policy)
    if name in ("Glob", "Grep"):
        return _search(call, policy)
    if name == "Bash":
        return _bash(call, policy)
    if name == "WebFetch":
        if "fetch" not in policy.caps:
            return Decision(DENY, "no-fetch-capability")
        url = call.tool_input.get("url")
        if not isinstance(url, str) or not _is_web_url(url):
            return Decision(DENY, "unparseable-url")
        return Decision(ALLOW, "fetch-granted")
    if name == "WebSearch":
        if "fetch" not in policy.caps:
            return Decision(DENY, "no-fetch-capability")
        return Decision(ALLOW, "fetch-granted")
    if name.startswith(MCP_PREFIX):
        if mcp_server_of(name, policy.mcp_servers) is None:
            return Decision(DENY, "connector-not-granted")
        return Decision(ALLOW, "connector-granted")
    return Decision(DENY, "unclassified-tool")


def _text(tool_input: Mapping[str, object], key: str) -> str:
    value = tool_input.get(key)
    if not isinstance(value, str) or not value:
        raise ScopeError(f"{key} is missing")
    return value


def _from_verdict(verdict: Verdict) -> Decision:
    return Decision(ALLOW if verdict.allowed else DENY, verdict.rule)


def _is_web_url(url: str) -> bool:
    lowered = url.strip().lower()
    for scheme in ("http://", "https://"):
        if lowered.startswith(scheme):
            host = lowered[len(scheme) :].split("/", 1)[0]
            return bool(host) and not any(ch.isspace() for ch in url)
    return False


# --- Bash and patches ----------------------------------------------------------------------


def _bash(call: HookCall, policy: Policy) -> Decision:
    if "exec" not in policy.caps:
        return Decision(DENY, "no-exec-capability")
    command = call.tool_input.get("command")
    if not isinstance(command, str):
        return Decision(DENY, "unparseable-command")
    if policy.scope.denied_paths_mentioned(command, call.cwd):
        return Decision(FLAG, "bash-mentions-denied-path")
    return Decision(ALLOW, "bash-recorded")


def patch_paths(patch_text: str) -> list[str]:
    """Every path a Codex patch adds, updates, deletes or moves to, in order."""
    paths: list[str] = []
    for line in patch_text.splitlines():
        match = _PATCH_TARGET.match(line)
        if match is not None:
            paths.append(match.group(1))
    return paths


def _apply_patch(call: HookCall, policy: Policy) -> Decision:
    if "write" not in policy.caps:
        return Decision(DENY, "no-write-capability")
    patch = call.tool_input.get("command")
    if not isinstance(patch, str):
        return Decision(DENY, "unparseable-patch")
    targets = patch_paths(patch)
    if not targets or not all(targets):
        return Decision(DENY, "unparseable-patch")
    rule = "inside-write-root"
    for target in targets:
        verdict = policy.scope.check_write(target, policy.write_root, call.cwd)
        if not verdict.allowed:
            return Decision(DENY, verdict.rule)
        rule = verdict.rule
    return Decision(ALLOW, rule)


# --- Glob and Grep -------------------------------------------------------------------------


def _search(call: HookCall, policy: Policy) -> Decision:
    if "read" not in policy.caps:
        return Decision(DENY, "no-read-capability")
    scope = policy.scope
    raw_root = call.tool_input.get("path")
    if raw_root is None or raw_root == "":
        raw_root = call.cwd
    if not isinstance(raw_root, str):
        return Decision(DENY, "unparseable-target")
    root = scope.canonical(raw_root, call.cwd)
    verdict = scope.check_read(root)
    if not verdict.allowed:
        return _from_verdict(verdict)
    if scope.is_ancestor_of_denied(root):
        return Decision(DENY, "search-covers-denied-path")
    key = "pattern" if call.tool_name == "Glob" else "glob"
    selector = call.tool_input.get(key)
    if call.tool_name == "Glob" and (not isinstance(selector, str) or not selector):
        return Decision(DENY, "unparseable-selector")
    if call.tool_name == "Grep" and not isinstance(call.tool_input.get("pattern"), str):
        return Decision(DENY, "unparseable-selector")
    if selector is None or selector == "":
        return Decision(ALLOW, verdict.rule)
    if not isinstance(selector, str):
        return Decision(DENY, "unparseable-selector")
    problem = _selector_problem(selector, root, scope)
    if problem is not None:
        return Decision(DENY, problem)
    return Decision(ALLOW, verdict.rule)


def _alternatives(selector: str) -> list[str] | None:
    """The selector with ``{a,b}`` groups expanded; None when there are too many."""
    pending = [selector]
    done: list[str] = []
    while pending:
        current = pending.pop()
        match = _BRACES.search(current)
        if match is None:
            done.append(current)
        else:
            head, tail = current[: match.start()], current[match.end() :]
            pending.extend(head + part + tail for part in match.group(1).split(","))
        if len(pending) + len(done) > _MAX_ALTERNATIVES:
            return None
    return done


def _could_name_secret(component: str) -> bool:
    if is_denied_name(component):
        return True
    if component.strip("*") == "":
        return False
    folded = component.casefold()
    return any(fnmatch.fnmatchcase(sample, folded) for sample in _SECRET_SAMPLES)


def _climbs(component: str) -> bool:
    return component == ".." or (
        component.strip("*") != "" and fnmatch.fnmatchcase("..", component)
    )


def _selector_problem(selector: str, root: str, scope: Scope) -> str | None:
    alternatives = _alternatives(selector)
    if alternatives is None:
        return "selector-too-complex"
    for alternative in alternatives:
        parts = alternative.split("/")
        if any(_climbs(part) for part in parts):
            return "selector-climbs"
        if any(_could_name_secret(part) for part in parts if part):
            return "selector-names-denied"
        literal: list[str] = []
        for part in parts:
            if _GLOB_CHARS & set(part):
                break
            literal.append(part)
        prefix = "/".join(literal)
        if not prefix.strip("/") and not alternative.startswith("/"):
            continue
        # An absolute or ~ selector starts its own search; a relative one may pass through a
        # symlink below the root. Either way its fixed part must pass the root's checks.
        start = scope.canonical(prefix or "/", root)
        verdict = scope.check_read(start)
        if not verdict.allowed:
            return verdict.rule
        if scope.is_ancestor_of_denied(start):
            return "search-covers-denied-path"
    return None
