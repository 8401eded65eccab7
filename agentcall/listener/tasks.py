"""Tasks: ``~/AgentCall/tasks/<id>/SKILL.md``, what an owner lets callers ask their agent to do.

A task is a directory named by its id (``TASK_RE``) holding ``SKILL.md``: a ``---`` fenced
frontmatter in the small YAML subset of :mod:`agentcall.listener.taskyaml`, then the body, which
is the owner's instructions to the agent. The frontmatter fields:

``description`` (required, 1-1000 chars), ``name`` (≤100, default the id), ``keywords`` (up
to 20, each ≤40), ``examples`` (up to 10, each ≤500), ``tools`` ⊂ {read, write, fetch, exec}
(default ``[read]``; read is always included), ``workdir`` (absolute, an existing directory
inside one of the owner's read roots once symlinks are resolved), ``timeout_s`` (1-300),
``threadable`` (default: true only without write and exec), ``connectors`` (MCP server names,
default none).

:func:`load_tasks` does not fail as a whole over a task's content: a task with any problem is
skipped and the problem is reported with its file and line, so one typo never takes the other
tasks — or the listener — down, and a task is never half-loaded. What it does fail over is
trust: the tasks directory, a task directory or a SKILL.md that is not the owner's own (owned by
someone else, writable by group or others, or a symlink leading out of the tasks directory)
raises :class:`~agentcall.listener.policy.PolicyError` naming it and the fix, because another
local account could have written a task with ``exec`` into it. The tasks directory itself may be
a symlink only within ``~/AgentCall``; a task directory or SKILL.md only within the tasks
directory. The built-in ``ask`` task is always present and its id
is reserved. Existing on disk is not being offered: the owner's policy decides who gets what.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Final, TypeVar

import attrs

from agentcall.filetrust import PrivateFileError, read_trusted, trusted_problem
from agentcall.ids import TASK_RE
from agentcall.listener.policy import PolicyError
from agentcall.listener.taskyaml import Entry, FrontmatterError, Value, parse_frontmatter

ASK_ID: Final = "ask"
TOOLS: Final = frozenset({"read", "write", "fetch", "exec"})
# Tools that change things; a task with either is not threadable unless the owner says so.
_MUTATING: Final = frozenset({"write", "exec"})
SKILL_FILE: Final = "SKILL.md"
MAX_SKILL_BYTES: Final = 64 * 1024
MAX_INSTRUCTIONS_CHARS: Final = 20_000
MAX_TASKS: Final = 200
MAX_DESCRIPTION_CHARS: Final = 1000
MAX_NAME_CHARS: Final = 100
MAX_KEYWORDS, MAX_KEYWORD_CHARS = 20, 40
MAX_EXAMPLES, MAX_EXAMPLE_CHARS = 10, 500
MAX_CONNECTORS = 20
TIMEOUT_RANGE: Final = (1, 300)
CONNECTOR_RE: Final = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}\Z")
_FENCE: Final = "---"
_TASK_DIR_MODE: Final = 0o755
T = TypeVar("T")


@attrs.frozen
class Task:
    """One task as the listener will run it; built only from a SKILL.md that fully validated."""

    id: str
    name: str
    description: str
    keywords: tuple[str, ...] = ()
    examples: tuple[str, ...] = ()
    tools: frozenset[str] = frozenset({"read"})
    # Canonical (symlinks resolved) and inside a read root; None: the listener's default.
    workdir: Path | None = None
    timeout_s: int | None = None
    threadable: bool = True
    connectors: tuple[str, ...] = ()
    instructions: str = ""
    # The SKILL.md it came from; None for the built-in task.
    path: Path | None = None


BUILTIN_ASK: Final = Task(
    id=ASK_ID,
    name="Ask a question",
    description="Ask a question; the agent answers by reading, and changes nothing.",
)


@attrs.frozen
class TaskProblem:
    """Why a task was skipped: the file (or directory), the 1-based line if known, the reason."""

    path: Path
    line: int | None
    message: str

    def __str__(self) -> str:
        where = f"{self.path}:{self.line}" if self.line is not None else str(self.path)
        return f"{where}: {self.message}"


@attrs.frozen
class TaskSet:
    """The tasks that loaded (always including ``ask``) and the problems of those that did not."""

    tasks: dict[str, Task] = attrs.field(factory=lambda: {ASK_ID: BUILTIN_ASK})
    problems: list[TaskProblem] = attrs.field(factory=list)

    @property
    def ids(self) -> frozenset[str]:
        return frozenset(self.tasks)


class _Bad(Exception):
    def __init__(self, line: int | None, message: str) -> None:
        super().__init__(message)
        self.line = line
        self.message = message


def _text(entry: Entry, field: str, limit: int) -> str:
    value = entry.value
    if isinstance(value, bool) or not isinstance(value, str):
        raise _Bad(entry.line, f"{field} must be text (quote it), not {_kind(value)}")
    value = value.strip()
    if not value:
        raise _Bad(entry.line, f"{field} is empty")
    if len(value) > limit:
        raise _Bad(entry.line, f"{field} is longer than {limit} characters")
    return value


def _texts(entry: Entry, field: str, count: int, limit: int) -> tuple[str, ...]:
    if not isinstance(entry.value, list):
        raise _Bad(entry.line, f"{field} must be a list, not {_kind(entry.value)}")
    if len(entry.value) > count:
        raise _Bad(entry.line, f"{field} has more than {count} items")
    return tuple(
        _text(Entry(item, entry.line), f"an item of {field}", limit) for item in entry.value
    )


def _kind(value: Value) -> str:
    if value is None:
        return "nothing"
    if isinstance(value, bool):
        return "true/false"
    if isinstance(value, int):
        return "a number"
    return "a list" if isinstance(value, list) else "text"


def _tools(entry: Entry) -> frozenset[str]:
    names = _texts(entry, "tools", len(TOOLS), 10)
    unknown = sorted(set(names) - TOOLS)
    if unknown:
        allowed = ", ".join(sorted(TOOLS))
        raise _Bad(entry.line, f"unknown tool {unknown[0]!r} (tools are {allowed})")
    return frozenset(names) | {"read"}


def _canonical(path: str) -> str:
    return os.path.normcase(os.path.realpath(path))


def _workdir(entry: Entry, read_roots: Iterable[str]) -> Path:
    raw = _text(entry, "workdir", 4096)
    if not os.path.isabs(raw):
        raise _Bad(entry.line, f"workdir must be an absolute path, not {raw!r}")
    if "\0" in raw:
        # No file system path holds NUL; realpath would raise ValueError instead of refusing.
        raise _Bad(entry.line, "workdir must not contain a NUL character")
    # Resolving symlinks first means a link inside a root cannot lead the agent outside it.
    real = _canonical(raw)
    inside = any(os.path.commonpath([real, root]) == root for root in map(_canonical, read_roots))
    if not inside:
        raise _Bad(entry.line, f"workdir {raw} is not inside any of your read roots")
    if not os.path.isdir(real):
        raise _Bad(entry.line, f"workdir {raw} is not an existing directory")
    return Path(real)


def _timeout(entry: Entry) -> int:
    value, (low, high) = entry.value, TIMEOUT_RANGE
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise _Bad(entry.line, f"timeout_s must be a whole number of seconds from {low} to {high}")
    return value


def _threadable(entry: Entry) -> bool:
    if not isinstance(entry.value, bool):
        raise _Bad(entry.line, "threadable must be true or false")
    return entry.value


def _connectors(entry: Entry) -> tuple[str, ...]:
    names = _texts(entry, "connectors", MAX_CONNECTORS, 64)
    for name in names:
        if not CONNECTOR_RE.match(name):
            raise _Bad(entry.line, f"connector {name!r} is not a valid MCP server name")
    if len(set(names)) != len(names):
        raise _Bad(entry.line, "a connector is listed twice")
    return names


_FIELDS: Final = (
    "description",
    "name",
    "keywords",
    "examples",
    "tools",
    "workdir",
    "timeout_s",
    "threadable",
    "connectors",
)


def _split(text: str) -> tuple[list[str], int, str]:
    """Frontmatter lines, the file line of the first of them, and the body."""
    lines = text.split("\n")
    if lines[0].rstrip("\r") != _FENCE:
        raise _Bad(1, "SKILL.md must start with a `---` line opening the frontmatter")
    for index in range(1, len(lines)):
        if lines[index].rstrip("\r \t") == _FENCE:
            return lines[1:index], 2, "\n".join(lines[index + 1 :])
    raise _Bad(None, "the frontmatter is never closed with a `---` line")


def parse_skill(task_id: str, text: str, path: Path, read_roots: Iterable[str]) -> Task:
    """Build one :class:`Task` from SKILL.md text, or raise ``_Bad`` with a line."""
    front, first, body = _split(text)
    try:
        fields = parse_frontmatter(front, first)
    except FrontmatterError as failure:
        raise _Bad(failure.line, failure.message) from None
    for key, entry in fields.items():
        if key not in _FIELDS:
            raise _Bad(entry.line, f"unknown key {key!r} (known: {', '.join(_FIELDS)})")
    if "description" not in fields:
        raise _Bad(None, "description is required")
    tools = _tools(fields["tools"]) if "tools" in fields else frozenset({"read"})
    instructions = body.replace("\r\n", "\n").strip()
    if len(instructions) > MAX_INSTRUCTIONS_CHARS:
        raise _Bad(None, f"the instructions are longer than {MAX_INSTRUCTIONS_CHARS} characters")

    def optional(key: str, parse: Callable[[Entry], T], default: T) -> T:
        entry = fields.get(key)
        return default if entry is None else parse(entry)

    return Task(
        id=task_id,
        name=optional("name", lambda e: _text(e, "name", MAX_NAME_CHARS), task_id),
        description=_text(fields["description"], "description", MAX_DESCRIPTION_CHARS),
        keywords=optional(
            "keywords", lambda e: _texts(e, "keywords", MAX_KEYWORDS, MAX_KEYWORD_CHARS), ()
        ),
        examples=optional(
            "examples", lambda e: _texts(e, "examples", MAX_EXAMPLES, MAX_EXAMPLE_CHARS), ()
        ),
        tools=tools,
        workdir=optional("workdir", lambda e: _workdir(e, read_roots), None),
        timeout_s=optional("timeout_s", _timeout, None),
        threadable=optional("threadable", _threadable, not (tools & _MUTATING)),
        connectors=optional("connectors", _connectors, ()),
        instructions=instructions,
        path=path,
    )


def _read_skill(path: Path, base: Path) -> str:
    try:
        raw = read_trusted(path, base, limit=MAX_SKILL_BYTES)
    except FileNotFoundError:
        raise _Bad(None, f"{SKILL_FILE} is missing") from None
    except PrivateFileError as failure:
        raise PolicyError.untrusted(failure) from None
    except OSError as failure:
        raise _Bad(None, f"cannot be read ({failure.strerror or type(failure).__name__})") from None
    if len(raw) > MAX_SKILL_BYTES:
        raise _Bad(None, f"is larger than {MAX_SKILL_BYTES} bytes")
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        raise _Bad(None, "is not UTF-8 text") from None


def _check_owned(path: Path, base: Path) -> None:
    """Refuse a directory someone else could have changed; a missing one is left to the caller."""
    try:
        problem = trusted_problem(path, base, directory=True)
    except FileNotFoundError:
        return
    if problem is not None:
        raise PolicyError(str(problem.path), problem.problem, problem.fix)


def _load_one(directory: Path, base: Path, read_roots: Iterable[str]) -> Task | TaskProblem:
    task_id = directory.name
    if task_id == ASK_ID:
        return TaskProblem(directory, None, "`ask` is built in and cannot be defined; rename it")
    if not TASK_RE.match(task_id):
        return TaskProblem(
            directory, None, "not a valid task id (lowercase letters, digits and -, up to 64)"
        )
    path = directory / SKILL_FILE
    try:
        _check_owned(directory, base)
        return parse_skill(task_id, _read_skill(path, base), path, read_roots)
    except _Bad as bad:
        return TaskProblem(path, bad.line, bad.message)


def load_tasks(tasks_dir: str | os.PathLike[str], read_roots: Iterable[str]) -> TaskSet:
    """Every valid task under ``tasks_dir`` plus ``ask``; invalid ones become problems.

    :raises PolicyError: a directory or SKILL.md could have been changed by someone else.
    """
    base = Path(os.path.abspath(tasks_dir))
    roots = tuple(read_roots)
    if os.path.isdir(base):
        # Anything else at that path is reported below as a directory that cannot be listed.
        # Its parent (~/AgentCall) too: whoever can write it can swap the whole tasks tree
        # between this check and the reads below.
        _check_owned(base.parent, base.parent.parent)
        _check_owned(base, base.parent)
    tasks: dict[str, Task] = {ASK_ID: BUILTIN_ASK}
    problems: list[TaskProblem] = []
    try:
        entries = sorted(os.scandir(base), key=lambda entry: entry.name)
    except FileNotFoundError:
        return TaskSet(tasks, problems)
    except OSError as failure:
        reason = failure.strerror or type(failure).__name__
        return TaskSet(tasks, [TaskProblem(base, None, f"cannot be listed ({reason})")])
    directories = [e for e in entries if not e.name.startswith(".") and e.is_dir()]
    for entry in directories[:MAX_TASKS]:
        loaded = _load_one(Path(entry.path), base, roots)
        if isinstance(loaded, Task):
            tasks[loaded.id] = loaded
        else:
            problems.append(loaded)
    for entry in directories[MAX_TASKS:]:
        problems.append(TaskProblem(Path(entry.path), None, f"more than {MAX_TASKS} tasks"))
    return TaskSet(tasks, problems)


_TEMPLATE: Final = """\
---
# Callers see this line in your menu. Required, up to 1000 characters.
description: "Say in a sentence what this task does for a caller."
# Optional fields: remove the # in front of a line to use it.
# name: "A short title"           # up to 100 characters; default: the task id
# keywords: [release, changelog]  # up to 20, each up to 40 characters
# examples:                       # up to 10 sample requests, each up to 500 characters
#   - "What changed since the last release?"
# tools: [read]                   # from read, write, fetch, exec; read is always included
# workdir: /absolute/path         # must be inside one of your read roots
# timeout_s: 120                  # 1 to 300 seconds
# threadable: true                # follow-ups allowed; default true unless write or exec
# connectors: []                  # MCP server names this task may use
---
Write your instructions to the agent here: what to look at, what to answer, what to avoid.
"""


class TaskIdError(ValueError):
    """A task id that cannot be scaffolded: malformed, or the reserved ``ask``."""


def scaffold_task(tasks_dir: str | os.PathLike[str], task_id: str) -> Path:
    """Write a commented SKILL.md template for ``task_id``; returns its path.

    :raises TaskIdError: the id is malformed or reserved.
    :raises FileExistsError: the task already has a SKILL.md (it is never overwritten).
    """
    if task_id == ASK_ID:
        raise TaskIdError("`ask` is built in and cannot be scaffolded")
    if not TASK_RE.match(task_id):
        raise TaskIdError(f"{task_id!r} is not a valid task id (lowercase letters, digits and -)")
    directory = Path(tasks_dir) / task_id
    missing = [directory, *directory.parents]
    for parent in reversed(missing[: next(i for i, d in enumerate(missing) if d.exists())]):
        # 0755 whatever the umask (even 002): a group-writable directory is refused on load.
        parent.mkdir(mode=_TASK_DIR_MODE, exist_ok=True)
    path = directory / SKILL_FILE
    # O_EXCL: an existing SKILL.md, even one created a moment ago, is never replaced.
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o644)
    with os.fdopen(fd, "w", encoding="utf-8") as out:
        out.write(_TEMPLATE)
    return path
