"""The administrator's ceiling: a machine-wide, root-owned limit over every owner policy.

Where it lives — per machine, independent of ``AGENTCALL_HOME`` and ``HOME``, so no user
setting can move it: ``/etc/agentcall/policy.json`` on Linux (and other Unix),
``/Library/Application Support/agentcall/policy.json`` on macOS. Format::

    {
      "version": 1,
      "allowed_tasks": ["ask", "review"],   # omitted: unconstrained; []: nothing may run
      "blocked_callers": ["mallory"],       # refused whatever the owner says
      "max_tools": ["read", "fetch"],       # a cap: other tools are removed from every task
      "assertions": [{"caller": "mallory", "deny": ["*"]}],
      "require_kernel_boundary": true,      # no agent runs where Landlock cannot confine it
      "require_process_isolation": true     # ... nor where it could signal or dial outside
    }

A task whose every tool is removed by ``max_tools`` cannot run at all. Layers compose one way:
the ceiling only ever narrows the owner's policy.

A missing file means the machine is unmanaged (:func:`load_ceiling` returns None). Anything
else that is wrong — unreadable, not a regular file, not owned by root, writable by group or
others, not exactly this shape — raises :class:`CeilingError`. That fails closed: the listener
refuses to start and no agent is spawned, because a limit the administrator set but that cannot
be read must never silently become "no limit".
"""

from __future__ import annotations

import os
import stat
import sys
from collections.abc import Mapping
from typing import Any, Final

import attrs

from agentcall.errors import AgentCallError
from agentcall.ids import HANDLE_RE
from agentcall.listener.policyfile import (
    Assertion,
    SchemaProblem,
    check_keys,
    decode_json,
    parse_assertions,
    parse_task_ids,
    show,
)
from agentcall.listener.tasks import TOOLS

CEILING_VERSION: Final = 1
LINUX_PATH: Final = "/etc/agentcall/policy.json"
MACOS_PATH: Final = "/Library/Application Support/agentcall/policy.json"
# Test seam only; see load_ceiling. Production code never sets allow_test_override.
TEST_OVERRIDE_ENV: Final = "AGENTCALL_TEST_CEILING_PATH"
MAX_CEILING_BYTES: Final = 1024 * 1024
MAX_BLOCKED_CALLERS: Final = 1000

_KEYS: Final = frozenset(
    {
        "version",
        "allowed_tasks",
        "blocked_callers",
        "max_tools",
        "assertions",
        "require_kernel_boundary",
        "require_process_isolation",
    }
)


class CeilingError(AgentCallError):
    """The ceiling exists but cannot be trusted or used; nothing may be spawned."""

    def __init__(self, path: str, problem: str) -> None:
        super().__init__(f"{path}: {problem}")
        self.path = path
        self.problem = problem


@attrs.frozen
class Ceiling:
    """The administrator's limits, as loaded from ``path``."""

    path: str
    # None: every task may run; an empty set: none may.
    allowed_tasks: frozenset[str] | None = None
    blocked_callers: frozenset[str] = frozenset()
    # None: no cap on tools.
    max_tools: frozenset[str] | None = None
    assertions: tuple[Assertion, ...] = ()
    # True: every agent runs inside the kernel boundary (Landlock), and none runs without it.
    require_kernel_boundary: bool = False
    # True: no agent runs unless the kernel also keeps it from other processes' signals and
    # abstract sockets (Landlock ABI 6) and the socket filter knows this machine.
    require_process_isolation: bool = False

    def allows_task(self, task_id: str) -> bool:
        return self.allowed_tasks is None or task_id in self.allowed_tasks

    def cap_tools(self, tools: frozenset[str]) -> frozenset[str]:
        return tools if self.max_tools is None else tools & self.max_tools


def default_ceiling_path(platform: str = sys.platform) -> str:
    """Where this machine's ceiling lives."""
    return MACOS_PATH if platform == "darwin" else LINUX_PATH


def _handles(value: Any, where: str) -> frozenset[str]:
    if not isinstance(value, list) or len(value) > MAX_BLOCKED_CALLERS:
        raise SchemaProblem(f"{where} must be a list of at most {MAX_BLOCKED_CALLERS} handles")
    for item in value:
        if not isinstance(item, str) or not HANDLE_RE.match(item):
            raise SchemaProblem(f"{where}: {show(item)} is not a handle")
    if len(set(value)) != len(value):
        raise SchemaProblem(f"{where} lists a handle twice")
    return frozenset(value)


def _tools(value: Any, where: str) -> frozenset[str]:
    if not isinstance(value, list):
        raise SchemaProblem(f"{where} must be a list of tools")
    for item in value:
        if not isinstance(item, str) or item not in TOOLS:
            raise SchemaProblem(f"{where}: {show(item)} is not one of {', '.join(sorted(TOOLS))}")
    if len(set(value)) != len(value):
        raise SchemaProblem(f"{where} lists a tool twice")
    return frozenset(value)


def _parse(data: Any, source: str) -> Ceiling:
    if not isinstance(data, dict):
        raise SchemaProblem("the top level must be a JSON object")
    check_keys(data, _KEYS, "the ceiling")
    version = data.get("version")
    if type(version) is not int or version != CEILING_VERSION:
        raise SchemaProblem(f'"version" must be {CEILING_VERSION}, not {show(version)}')
    allowed = None
    if "allowed_tasks" in data:
        allowed = frozenset(parse_task_ids(data["allowed_tasks"], "allowed_tasks"))
    blocked = _handles(data.get("blocked_callers", []), "blocked_callers")
    max_tools = _tools(data["max_tools"], "max_tools") if "max_tools" in data else None
    assertions = parse_assertions(data.get("assertions", []), "assertions")
    require = data.get("require_kernel_boundary", False)
    if type(require) is not bool:
        raise SchemaProblem(f'"require_kernel_boundary" must be true or false, not {show(require)}')
    isolation = data.get("require_process_isolation", False)
    if type(isolation) is not bool:
        raise SchemaProblem(
            f'"require_process_isolation" must be true or false, not {show(isolation)}'
        )
    return Ceiling(source, allowed, blocked, max_tools, assertions, require, isolation)


def parse_ceiling(data: Any, *, source: str) -> Ceiling:
    """Validate already-decoded JSON; ``source`` names the file in any :class:`CeilingError`."""
    try:
        return _parse(data, source)
    except SchemaProblem as problem:
        raise CeilingError(source, str(problem)) from None


def _reason(failure: OSError) -> str:
    return failure.strerror or type(failure).__name__


def _read_trusted(name: str, owner: int) -> bytes:
    """The file's bytes, if it is a regular file owned by ``owner`` that only it can change."""
    try:
        fd = os.open(name, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    except OSError as failure:
        # Includes a symlink that leads nowhere: something is there, so it is not "missing".
        raise CeilingError(name, f"cannot be read ({_reason(failure)})") from None
    try:
        # Checked on the open descriptor, so the file read is the file checked.
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise CeilingError(name, "is not a regular file")
        if info.st_uid != owner:
            expected = "root" if owner == 0 else f"uid {owner} (test override)"
            raise CeilingError(name, f"is owned by uid {info.st_uid}, not {expected}")
        if info.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
            raise CeilingError(name, "is writable by group or others; make it 0644 or stricter")
        chunks: list[bytes] = []
        size = 0
        while size <= MAX_CEILING_BYTES:
            chunk = os.read(fd, MAX_CEILING_BYTES + 1 - size)
            if not chunk:
                break
            chunks.append(chunk)
            size += len(chunk)
    except OSError as failure:
        raise CeilingError(name, f"cannot be read ({_reason(failure)})") from None
    finally:
        os.close(fd)
    raw = b"".join(chunks)
    if len(raw) > MAX_CEILING_BYTES:
        raise CeilingError(name, f"is larger than {MAX_CEILING_BYTES} bytes")
    return raw


def load_ceiling(
    path: str | os.PathLike[str] | None = None,
    *,
    environ: Mapping[str, str] = os.environ,
    allow_test_override: bool = False,
) -> Ceiling | None:
    """Load the admin ceiling: None when there is none, else a :class:`Ceiling`.

    ``path`` defaults to :func:`default_ceiling_path`. The file must be owned by root.

    **TEST-ONLY REDIRECT. The production listener and CLI MUST call this with
    ``allow_test_override=False`` (the default).** Only when ``allow_test_override`` is True
    *and* ``$AGENTCALL_TEST_CEILING_PATH`` is set is that path read instead, with the root-owner
    check replaced by "owned by the current user", so tests can exercise a managed machine
    without root. With the flag False the variable is ignored entirely, so no environment a
    user controls can move or weaken the ceiling.

    :raises CeilingError: the file exists but is unreadable, not a regular file, wrongly owned
        or writable, or malformed. Callers must then spawn nothing.
    """
    override = environ.get(TEST_OVERRIDE_ENV, "") if allow_test_override else ""
    if override:
        name, owner = override, os.geteuid()
    else:
        name = os.fspath(path) if path is not None else default_ceiling_path()
        owner = 0
    try:
        os.lstat(name)
    except FileNotFoundError:
        return None
    except OSError as failure:
        # e.g. a parent that is not a directory, or one we may not search: not provably absent.
        raise CeilingError(name, f"cannot be examined ({_reason(failure)})") from None
    raw = _read_trusted(name, owner)
    try:
        data = decode_json(raw)
    except SchemaProblem as problem:
        raise CeilingError(name, str(problem)) from None
    return parse_ceiling(data, source=name)
