"""agentcall.client.codecache: attrs' and cattrs' generated code is compiled once per
installation, kept privately, and never taken from a place someone else may write."""

from __future__ import annotations

import json
import marshal
import os
import subprocess
import sys
from pathlib import Path
from types import CodeType

import pytest

from agentcall.client import codecache

REPO = Path(__file__).resolve().parents[2]
SOURCE = "def f(x):\n    return x * 2\n"


def private_state(tmp_path: Path) -> Path:
    state = tmp_path / "state"
    state.mkdir(mode=0o700)
    return state


def run_function(code: CodeType) -> object:
    namespace: dict[str, object] = {}
    exec(code, namespace)
    return namespace["f"](21)  # type: ignore[operator]


def test_code_compiled_once_is_read_back_by_the_next_run(tmp_path: Path) -> None:
    directory = codecache.cache_directory(private_state(tmp_path))
    assert directory is not None
    first = codecache.CodeCache(directory)
    made = first.compile(SOURCE, "<generated f>", "exec")
    assert (first.hits, first.misses) == (0, 1)
    again = codecache.CodeCache(directory)
    kept = again.compile(SOURCE, "<generated f>", "exec")
    assert (again.hits, again.misses) == (1, 0)
    assert kept.co_filename == "<generated f>"
    assert run_function(kept) == run_function(made) == 42
    # Another source or another filename is another entry.
    again.compile(SOURCE.replace("2", "3"), "<generated f>", "exec")
    again.compile(SOURCE, "<generated g>", "exec")
    assert again.misses == 2
    assert (os.stat(directory).st_mode & 0o777, len(os.listdir(directory))) == (0o700, 3)


def test_a_damaged_or_foreign_entry_is_compiled_again_and_replaced(tmp_path: Path) -> None:
    directory = codecache.cache_directory(private_state(tmp_path))
    assert directory is not None
    codecache.CodeCache(directory).compile(SOURCE, "<generated f>", "exec")
    (entry,) = os.listdir(directory)
    path = os.path.join(directory, entry)
    for damage in (b"not marshal", marshal.dumps(compile(SOURCE, "<elsewhere>", "exec"))):
        Path(path).write_bytes(damage)
        cache = codecache.CodeCache(directory)
        assert run_function(cache.compile(SOURCE, "<generated f>", "exec")) == 42
        assert (cache.hits, cache.misses) == (0, 1)
        assert marshal.loads(Path(path).read_bytes()).co_filename == "<generated f>"


def test_compiles_with_other_arguments_are_left_alone(tmp_path: Path) -> None:
    directory = codecache.cache_directory(private_state(tmp_path))
    assert directory is not None
    cache = codecache.CodeCache(directory)
    cache.compile(SOURCE, "<generated f>", "exec", 0, True)
    cache.compile(SOURCE.encode(), "<generated f>", "exec")
    assert (cache.hits, cache.misses, os.listdir(directory)) == (0, 0, [])


@pytest.mark.parametrize(
    "problem", ["state_writable", "state_readable", "cache_writable", "cache_symlink"]
)
def test_no_cache_where_someone_else_could_write_it(tmp_path: Path, problem: str) -> None:
    state = private_state(tmp_path)
    if problem == "state_writable":
        state.chmod(0o777)
    elif problem == "state_readable":
        # The state directory's own rule (filetrust): 0700, as for the keys in it.
        state.chmod(0o750)
    elif problem == "cache_writable":
        (state / "cache").mkdir(mode=0o700)
        (state / "cache").chmod(0o770)
    else:
        elsewhere = tmp_path / "elsewhere"
        elsewhere.mkdir(mode=0o700)
        (state / "cache").symlink_to(elsewhere)
    assert codecache.cache_directory(state) is None
    assert codecache.install(state) is None


def test_a_full_cache_is_emptied_of_its_own_entries_only(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    state = private_state(tmp_path)
    directory = codecache.cache_directory(state)
    assert directory is not None
    for n in range(3):
        codecache.CodeCache(directory).compile(f"x = {n}\n", "<generated x>", "exec")
    Path(directory, "notes.txt").write_text("not an entry")
    monkeypatch.setattr(codecache, "MAX_ENTRIES", 3)
    try:
        assert codecache.install(state) is not None
    finally:
        codecache.restore_builtin_compile()
    assert os.listdir(directory) == ["notes.txt"]


# Two fresh interpreters with different string hashing: the second makes the same attrs
# classes and cattrs functions without compiling anything, and they behave as made.
_RUN = """
import json, sys
from pathlib import Path
from agentcall.client import codecache
cache = codecache.install(Path(sys.argv[1]))
from agentcall.wire import codec, frames
status = frames.CallStatus(call_id="0e88c9c9-8337-49ba-a0c1-ecf9074d3f07", state="working")
same = codec.decode_frame(codec.encode(status))
print(json.dumps({
    "hits": cache.hits, "misses": cache.misses,
    "equal": same == status, "hash": hash(same) == hash(status), "set": len({same, status}),
    "other": same != frames.CallStatus(call_id=status.call_id, state="ringing"),
}))
"""


def test_a_second_process_builds_the_wire_classes_without_compiling(tmp_path: Path) -> None:
    state = private_state(tmp_path)
    runs = []
    for seed in ("1", "2"):
        done = subprocess.run(
            [sys.executable, "-W", "ignore", "-c", _RUN, str(state)],
            capture_output=True,
            text=True,
            timeout=120,
            check=True,
            cwd=REPO,
            env={**os.environ, "PYTHONHASHSEED": seed},
        )
        runs.append(json.loads(done.stdout))
    first, second = runs
    assert first["misses"] > 10
    # attrs' __hash__ salt differs between the two (string hashing), yet nothing is compiled.
    assert (second["misses"], second["hits"]) == (0, first["hits"] + first["misses"])
    for run in runs:
        assert (run["equal"], run["hash"], run["set"], run["other"]) == (True, True, 1, True)


def test_the_builtin_compile_can_be_given_back(tmp_path: Path) -> None:
    import attr._make

    try:
        assert codecache.install(private_state(tmp_path)) is not None
        assert vars(attr._make)["compile"].__self__.directory.startswith(str(tmp_path))
    finally:
        codecache.restore_builtin_compile()
    assert "compile" not in vars(attr._make)
