"""SKILL.md tasks: every field, every error with its file and line, the loader, the scaffold."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from agentcall.listener.policy import PolicyError
from agentcall.listener.tasks import (
    BUILTIN_ASK,
    MAX_TASKS,
    Task,
    TaskIdError,
    TaskProblem,
    TaskSet,
    load_tasks,
    scaffold_task,
)
from agentcall.listener.taskyaml import Entry, FrontmatterError, parse_frontmatter


@pytest.fixture
def roots(tmp_path: Path) -> list[str]:
    root = tmp_path / "work"
    (root / "src").mkdir(parents=True)
    return [str(root)]


@pytest.fixture
def tasks_dir(tmp_path: Path) -> Path:
    return tmp_path / "tasks"


def skill(front: str, body: str = "Look at the code and answer.") -> str:
    return f"---\n{front}\n---\n{body}\n"


def put(tasks_dir: Path, task_id: str, text: str | bytes) -> Path:
    directory = tasks_dir / task_id
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / "SKILL.md"
    if isinstance(text, bytes):
        path.write_bytes(text)
    else:
        path.write_text(text, "utf-8")
    return path


def load_one(tasks_dir: Path, roots: list[str], text: str | bytes) -> Task | TaskProblem:
    path = put(tasks_dir, "review", text)
    loaded = load_tasks(tasks_dir, roots)
    if "review" in loaded.tasks:
        assert loaded.problems == []
        return loaded.tasks["review"]
    assert len(loaded.problems) == 1
    assert loaded.problems[0].path == path
    return loaded.problems[0]


def test_every_field_is_read(tasks_dir: Path, roots: list[str]) -> None:
    """All frontmatter fields, in both list styles, quoted and plain, with comments."""
    text = skill(
        "\n".join(
            [
                "# who this is for",
                'description: "Review a branch: style, tests, risk"',
                "name: Code review  # shown in the menu",
                "keywords: [review, 'pull request', ci]",
                "examples:",
                '  - "Is feature/x ready to merge?"',
                "  - what broke the build",
                "tools: [fetch, read]",
                f"workdir: {roots[0]}/src",
                "timeout_s: 120",
                "threadable: false",
                "connectors: [github, jira.cloud]",
            ]
        ),
        body="\nRead the diff.\nAnswer in bullets.\n\n",
    )
    task = load_one(tasks_dir, roots, text)
    assert task == Task(
        id="review",
        name="Code review",
        description="Review a branch: style, tests, risk",
        keywords=("review", "pull request", "ci"),
        examples=("Is feature/x ready to merge?", "what broke the build"),
        tools=frozenset({"read", "fetch"}),
        workdir=Path(os.path.realpath(roots[0])) / "src",
        timeout_s=120,
        threadable=False,
        connectors=("github", "jira.cloud"),
        instructions="Read the diff.\nAnswer in bullets.",
        path=tasks_dir / "review" / "SKILL.md",
    )


def test_only_description_is_required(tasks_dir: Path, roots: list[str]) -> None:
    """Defaults: name is the id, read only, threadable, no workdir, timeout or connectors."""
    task = load_one(tasks_dir, roots, skill("description: Answer questions"))
    assert isinstance(task, Task)
    assert (task.name, task.tools, task.threadable) == ("review", frozenset({"read"}), True)
    assert (task.workdir, task.timeout_s, task.connectors, task.keywords) == (None, None, (), ())


@pytest.mark.parametrize(
    ("tools", "threadable", "expected_tools", "expected_threadable"),
    [
        ("[]", None, {"read"}, True),
        ("[fetch]", None, {"read", "fetch"}, True),
        ("[write]", None, {"read", "write"}, False),
        ("[exec, read]", None, {"read", "exec"}, False),
        ("[exec]", "true", {"read", "exec"}, True),
        ("[read]", "false", {"read"}, False),
    ],
)
def test_tools_imply_read_and_set_the_threadable_default(
    tasks_dir: Path,
    roots: list[str],
    tools: str,
    threadable: str | None,
    expected_tools: set[str],
    expected_threadable: bool,
) -> None:
    """read is always granted; write or exec make a task non-threadable unless stated."""
    front = f"description: d\ntools: {tools}"
    if threadable is not None:
        front += f"\nthreadable: {threadable}"
    task = load_one(tasks_dir, roots, skill(front))
    assert isinstance(task, Task)
    assert task.tools == frozenset(expected_tools)
    assert task.threadable is expected_threadable


LONG = "x" * 1001
# frontmatter (line 2 onward) -> (expected line, part of the message)
BAD_FRONTMATTER = {
    "unknown key": ("description: d\ntier: 2", 3, "unknown key 'tier'"),
    "no description": ("name: n", None, "description is required"),
    "empty description": ('description: ""', 2, "description is empty"),
    "long description": (f"description: {LONG}", 2, "longer than 1000"),
    "numeric description": ("description: 42", 2, "must be text"),
    "null description": ("description:", 2, "must be text"),
    "long name": (f"description: d\nname: {'n' * 101}", 3, "name is longer than 100"),
    "keywords scalar": ("description: d\nkeywords: review", 3, "keywords must be a list"),
    "too many keywords": (
        "description: d\nkeywords: [" + ", ".join(f"k{n}" for n in range(21)) + "]",
        3,
        "more than 20",
    ),
    "long keyword": (f"description: d\nkeywords: [{'k' * 41}]", 3, "longer than 40"),
    "too many examples": (
        "description: d\nexamples:\n" + "\n".join(f"  - e{n}" for n in range(11)),
        3,
        "more than 10",
    ),
    "long example": (f"description: d\nexamples:\n  - {'e' * 501}", 3, "longer than 500"),
    "unknown tool": ("description: d\ntools: [read, sudo]", 3, "unknown tool 'sudo'"),
    "tools scalar": ("description: d\ntools: read", 3, "tools must be a list"),
    "relative workdir": ("description: d\nworkdir: src", 3, "absolute path"),
    "workdir outside roots": ("description: d\nworkdir: /", 3, "not inside any of your read"),
    "timeout zero": ("description: d\ntimeout_s: 0", 3, "from 1 to 300"),
    "timeout too long": ("description: d\ntimeout_s: 301", 3, "from 1 to 300"),
    "timeout text": ("description: d\ntimeout_s: soon", 3, "from 1 to 300"),
    "timeout bool": ("description: d\ntimeout_s: true", 3, "from 1 to 300"),
    "threadable text": ("description: d\nthreadable: yes", 3, "true or false"),
    "bad connector": ("description: d\nconnectors: ['has space']", 3, "not a valid MCP"),
    "connector twice": ("description: d\nconnectors: [gh, gh]", 3, "listed twice"),
    "duplicate key": ("description: d\nname: a\nname: b", 4, "appears twice"),
    "stray indentation": ("description: d\n  more text", 3, "unexpected indentation"),
    "no colon space": ("description:d", 2, "expected `key: value`"),
    "open quote": ('description: "never closed', 2, "not closed"),
    "text after quote": ('description: "a" b', 2, "after a quoted string"),
    "bad escape": ('description: "a\\qb"', 2, "unsupported escape"),
    "open inline list": ("description: d\ntools: [read, fetch", 3, "must end with ]"),
    "empty list item": ("description: d\ntools: [read, , fetch]", 3, "empty item"),
    "no commas": ('description: d\nkeywords: ["a" "b"]', 3, "separated by commas"),
    "block scalar": ("description: |\n  text", 2, "unsupported YAML"),
    "flow map": ("description: {a: 1}", 2, "unsupported YAML"),
    "anchor": ("description: &a text", 2, "unsupported YAML"),
    "colon in plain": ("description: fix: things", 2, "needs quotes"),
    "tab in block": ("description: d\nexamples:\n\t- a", 4, "tabs"),
    "not an item": ("description: d\nexamples:\n  just text", 4, "expected a `- item`"),
    "empty item": ("description: d\nexamples:\n  -", 4, "no value"),
}


@pytest.mark.parametrize("name", sorted(BAD_FRONTMATTER))
def test_each_bad_frontmatter_is_a_problem_with_its_line(
    tasks_dir: Path, roots: list[str], name: str
) -> None:
    """An invalid task is skipped, with the file, the line and what is wrong."""
    front, line, message = BAD_FRONTMATTER[name]
    problem = load_one(tasks_dir, roots, skill(front))
    assert isinstance(problem, TaskProblem)
    assert (problem.line, message in problem.message) == (line, True), problem.message
    where = f"{tasks_dir / 'review' / 'SKILL.md'}" + (f":{line}" if line else "")
    assert str(problem).startswith(f"{where}: ")


@pytest.mark.parametrize(
    ("text", "line", "message"),
    [
        ("description: d\n---\nbody\n", 1, "must start with a `---`"),
        ("---\ndescription: d\nbody\n", None, "never closed"),
        (skill("description: d", body="b" * 20_001), None, "longer than 20000"),
        ("---\n---\nbody", None, "description is required"),
    ],
)
def test_fences_and_body_limit(
    tasks_dir: Path, roots: list[str], text: str, line: int | None, message: str
) -> None:
    """The frontmatter must be fenced by --- lines; the instructions have a size limit."""
    problem = load_one(tasks_dir, roots, text)
    assert isinstance(problem, TaskProblem)
    assert problem.line == line and message in problem.message


def test_a_body_at_the_limit_loads_and_crlf_files_work(tasks_dir: Path, roots: list[str]) -> None:
    """20,000 characters of instructions are fine; Windows line endings are too."""
    text = skill("description: d", body="b" * 20_000).replace("\n", "\r\n")
    task = load_one(tasks_dir, roots, text)
    assert isinstance(task, Task) and len(task.instructions) == 20_000


def test_unreadable_oversized_and_binary_files_are_problems(
    tasks_dir: Path, roots: list[str]
) -> None:
    """Not UTF-8, larger than 64 KiB, or no SKILL.md at all: each is a problem."""
    put(tasks_dir, "binary", b"---\ndescription: \xff\n---\n")
    put(tasks_dir, "huge", skill("description: d", body="b" * 70_000))
    (tasks_dir / "empty").mkdir()
    loaded = load_tasks(tasks_dir, roots)
    messages = {problem.path.parent.name: problem.message for problem in loaded.problems}
    assert "not UTF-8" in messages["binary"]
    assert "larger than" in messages["huge"]
    assert "SKILL.md is missing" in messages["empty"]
    assert set(loaded.tasks) == {"ask"}


def test_workdir_must_be_a_real_directory_inside_a_root(
    tasks_dir: Path, roots: list[str], tmp_path: Path
) -> None:
    """Symlinks are resolved first, so a link inside a root cannot point the agent outside."""
    outside = tmp_path / "secrets"
    outside.mkdir()
    link = Path(roots[0]) / "escape"
    link.symlink_to(outside)
    problem = load_one(tasks_dir, roots, skill(f"description: d\nworkdir: {link}"))
    assert isinstance(problem, TaskProblem) and "not inside" in problem.message
    missing = f"{roots[0]}/nope"
    problem = load_one(tasks_dir, roots, skill(f"description: d\nworkdir: {missing}"))
    assert isinstance(problem, TaskProblem) and "not an existing directory" in problem.message
    inward = Path(roots[0]) / "inward"
    inward.symlink_to(Path(roots[0]) / "src")
    task = load_one(tasks_dir, roots, skill(f"description: d\nworkdir: {inward}"))
    assert isinstance(task, Task) and task.workdir == Path(os.path.realpath(roots[0])) / "src"


def test_a_root_given_through_a_symlink_still_contains_its_directories(
    tasks_dir: Path, tmp_path: Path
) -> None:
    """Roots are canonicalised too, so a symlinked home still works."""
    real = tmp_path / "real"
    (real / "proj").mkdir(parents=True)
    alias = tmp_path / "alias"
    alias.symlink_to(real)
    task = load_one(tasks_dir, [str(alias)], skill(f"description: d\nworkdir: {alias}/proj"))
    assert isinstance(task, Task) and task.workdir == Path(os.path.realpath(real / "proj"))


def test_directory_names_are_task_ids_and_ask_is_reserved(
    tasks_dir: Path, roots: list[str]
) -> None:
    """Bad names and `ask` are problems; other tasks load; dotfiles and files are ignored."""
    put(tasks_dir, "Bad_Name", skill("description: d"))
    put(tasks_dir, "ask", skill("description: mine"))
    put(tasks_dir, "good", skill("description: d"))
    (tasks_dir / ".git").mkdir()
    (tasks_dir / "README.md").write_text("notes")
    loaded = load_tasks(tasks_dir, roots)
    assert set(loaded.tasks) == {"ask", "good"}
    assert loaded.tasks["ask"] is BUILTIN_ASK
    problems = {problem.path.name: problem.message for problem in loaded.problems}
    assert set(problems) == {"Bad_Name", "ask"}
    assert "built in" in problems["ask"] and "not a valid task id" in problems["Bad_Name"]


def test_one_bad_task_never_hides_the_others(tasks_dir: Path, roots: list[str]) -> None:
    """Loading continues past a broken task, and the broken one is not half-loaded."""
    put(tasks_dir, "a-good", skill("description: first"))
    put(tasks_dir, "b-bad", skill("description: d\ntools: [root]"))
    put(tasks_dir, "c-good", skill("description: third"))
    loaded = load_tasks(tasks_dir, roots)
    assert sorted(loaded.tasks) == ["a-good", "ask", "c-good"]
    assert [p.path.parent.name for p in loaded.problems] == ["b-bad"]


def test_missing_and_unlistable_task_directories(tmp_path: Path, roots: list[str]) -> None:
    """No tasks directory is just `ask`; a file where it should be is a problem."""
    assert load_tasks(tmp_path / "none", roots) == TaskSet()
    blocker = tmp_path / "file"
    blocker.write_text("x")
    loaded = load_tasks(blocker, roots)
    assert set(loaded.tasks) == {"ask"}
    assert loaded.problems[0].path == blocker and "cannot be listed" in loaded.problems[0].message


def test_too_many_tasks_are_reported(tasks_dir: Path, roots: list[str]) -> None:
    """Past the cap, further task directories are problems, not tasks."""
    for n in range(MAX_TASKS + 2):
        (tasks_dir / f"t{n:03d}").mkdir(parents=True)
    loaded = load_tasks(tasks_dir, roots)
    assert sum("more than" in p.message for p in loaded.problems) == 2


def test_builtin_ask_is_read_only_and_threadable() -> None:
    """The built-in task reads, may continue a conversation, and carries no instructions."""
    assert TaskSet().tasks == {"ask": BUILTIN_ASK}
    assert BUILTIN_ASK.tools == frozenset({"read"}) and BUILTIN_ASK.threadable
    assert BUILTIN_ASK.instructions == "" and BUILTIN_ASK.path is None


def test_scaffold_writes_a_template_that_loads(tasks_dir: Path, roots: list[str]) -> None:
    """The template is a valid read-only task with every optional field commented out."""
    path = scaffold_task(tasks_dir, "release-notes")
    assert path == tasks_dir / "release-notes" / "SKILL.md"
    text = path.read_text()
    for field in ("name", "keywords", "examples", "tools", "workdir", "timeout_s", "threadable"):
        assert f"# {field}:" in text
    loaded = load_tasks(tasks_dir, roots)
    assert loaded.problems == []
    task = loaded.tasks["release-notes"]
    assert task.tools == frozenset({"read"}) and task.instructions


def test_scaffold_never_overwrites_and_refuses_bad_ids(tasks_dir: Path) -> None:
    """An existing SKILL.md is kept; `ask` and malformed ids are refused."""
    path = put(tasks_dir, "mine", "hand written")
    with pytest.raises(FileExistsError):
        scaffold_task(tasks_dir, "mine")
    assert path.read_text() == "hand written"
    for bad in ("ask", "Bad", "-x", "a" * 65, "../up"):
        with pytest.raises(TaskIdError):
            scaffold_task(tasks_dir, bad)
    assert sorted(p.name for p in tasks_dir.iterdir()) == ["mine"]


def test_frontmatter_values_and_lines() -> None:
    """The YAML subset: types, quoting, comments, block lists and 1-based file lines."""
    lines = [
        "# comment",
        "a: plain text",
        "b: 'it''s'",
        'c: "tab\\there"',
        "d: -12",
        "e: True",
        "f: ~",
        "g:",
        "- x",
        "",
        "  - 'y # not a comment'  # a comment",
        "h: [1, 'two', three]",
        "i: a#b",
    ]
    parsed = parse_frontmatter(lines, 2)
    assert parsed == {
        "a": Entry("plain text", 3),
        "b": Entry("it's", 4),
        "c": Entry("tab\there", 5),
        "d": Entry(-12, 6),
        "e": Entry(True, 7),
        "f": Entry(None, 8),
        "g": Entry(["x", "y # not a comment"], 9),
        "h": Entry([1, "two", "three"], 13),
        "i": Entry("a#b", 14),
    }


@given(st.lists(st.text(alphabet=" \t-:#[]{}'\"\\,|&ab1\r", max_size=20), max_size=8))
def test_any_frontmatter_parses_or_raises_the_one_error(lines: list[str]) -> None:
    """Hostile frontmatter never crashes the parser with anything but FrontmatterError."""
    try:
        parse_frontmatter(lines, 2)
    except FrontmatterError as failure:
        assert 2 <= failure.line <= len(lines) + 1


# --- the tasks must be the owner's own (issue 7 item 3) ------------------------------------------

EXEC_TASK = skill('description: "Run anything"\ntools: [read, exec]')


@pytest.mark.parametrize("mode", [0o666, 0o664, 0o646])
def test_a_skill_others_can_write_is_a_policy_error(
    tasks_dir: Path, roots: list[str], mode: int
) -> None:
    """Not a skipped task: every call is refused until the owner runs the chmod."""
    path = put(tasks_dir, "shell", EXEC_TASK)
    path.chmod(mode)
    with pytest.raises(PolicyError) as caught:
        load_tasks(tasks_dir, roots)
    assert caught.value.path == str(path.resolve())
    assert caught.value.fix == f"run `chmod go-w {path.resolve()}`"


@pytest.mark.parametrize("which", ["parent", "tasks", "task"])
def test_a_directory_others_can_write_is_a_policy_error(
    tasks_dir: Path, roots: list[str], which: str
) -> None:
    """The tasks directory, its parent (~/AgentCall) and each task directory count too: others
    could add or swap a task, or the whole tasks tree."""
    put(tasks_dir, "shell", EXEC_TASK)
    loose = {"parent": tasks_dir.parent, "tasks": tasks_dir, "task": tasks_dir / "shell"}[which]
    loose.chmod(0o777)
    with pytest.raises(PolicyError, match=f"run `chmod go-w {loose.resolve()}`"):
        load_tasks(tasks_dir, roots)


def test_a_skill_linked_out_of_the_tasks_directory_is_a_policy_error(
    tasks_dir: Path, roots: list[str], tmp_path: Path
) -> None:
    """A SKILL.md symlink leading elsewhere is refused, even to a file of ours."""
    outside = tmp_path / "elsewhere.md"
    outside.write_text(EXEC_TASK)
    (tasks_dir / "shell").mkdir(parents=True)
    (tasks_dir / "shell" / "SKILL.md").symlink_to(outside)
    with pytest.raises(PolicyError, match=r"is a symbolic link to .* outside"):
        load_tasks(tasks_dir, roots)


def test_a_task_directory_linked_out_is_a_policy_error(
    tasks_dir: Path, roots: list[str], tmp_path: Path
) -> None:
    """A task directory symlinked out of the tasks directory is refused too."""
    elsewhere = tmp_path / "elsewhere"
    put(elsewhere, "shell", EXEC_TASK)
    tasks_dir.mkdir()
    (tasks_dir / "shell").symlink_to(elsewhere / "shell")
    with pytest.raises(PolicyError, match=r"is a symbolic link to .* outside"):
        load_tasks(tasks_dir, roots)


def test_links_inside_the_tasks_directory_are_followed(tasks_dir: Path, roots: list[str]) -> None:
    """One SKILL.md shared by two tasks through a link inside the tasks directory."""
    put(tasks_dir, "review", skill('description: "Review"'))
    (tasks_dir / "review-again").mkdir()
    (tasks_dir / "review-again" / "SKILL.md").symlink_to(tasks_dir / "review" / "SKILL.md")
    loaded = load_tasks(tasks_dir, roots)
    assert {"review", "review-again"} <= set(loaded.tasks) and loaded.problems == []


def test_a_scaffolded_task_loads_under_a_group_writable_umask(
    tmp_path: Path, roots: list[str]
) -> None:
    """With umask 002 the scaffold still makes 0755 directories, so the task is not refused."""
    tasks = tmp_path / "AgentCall" / "tasks"
    old = os.umask(0o002)
    try:
        scaffold_task(tasks, "notes")
    finally:
        os.umask(old)
    assert "notes" in load_tasks(tasks, roots).tasks
