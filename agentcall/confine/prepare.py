"""The listener's side of the boundary: turn a run's :class:`~rules.Confinement` into the
wrapped argv, its environment and a private temporary directory.

Runs in the listener just before a spawn: a few real paths, a shebang line, and the listing
of the directories that lead to denied entries (the home directory and a few below it), never
a walk of a tree.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import sys
import tempfile
from collections.abc import Mapping, Sequence
from typing import NamedTuple

from agentcall.confine import needs, rules
from agentcall.confine.main import PARENT_ENV, encode_ruleset

WRAPPER_MODULE = "agentcall.confine"
RULESET_NAME = "ruleset"


class OsView:
    """:class:`rules.FileView` over the real file system."""

    def realpath(self, path: str) -> str:
        return os.path.realpath(path)

    def exists(self, path: str) -> bool:
        return os.path.exists(path)

    def listdir(self, path: str) -> list[str]:
        try:
            return os.listdir(path) if os.path.isdir(path) else []
        except OSError:
            return []


class Prepared(NamedTuple):
    """What the runner spawns instead: the wrapper's argv, the environment, the temp dir."""

    argv: tuple[str, ...]
    env: dict[str, str]
    private_tmp: str


# The wrapper's start under ``-S``: the package root (argv[1]) goes after the standard library
# on the module path, then main runs on the rest of argv and leads the run's session.
BOOT = (
    "import sys\n"
    "sys.path.append(sys.argv.pop(1))\n"
    "from agentcall.confine.main import main\n"
    "sys.exit(main(new_session=True))\n"
)


def package_root() -> str | None:
    """The directory that holds the ``agentcall`` package on disk (None: it is not a plain
    directory there, e.g. inside a zip)."""
    import agentcall

    package = os.path.dirname(os.path.abspath(agentcall.__file__ or ""))
    if not os.path.isfile(os.path.join(package, "confine", "main.py")):
        return None
    return os.path.dirname(package)


def wrapper_argv(ruleset_path: str, argv: Sequence[str]) -> list[str]:
    """This interpreter, isolated (no cwd or ``PYTHON*`` on the module path), on the wrapper,
    which makes the run a session of its own. Without ``site`` where the package is a plain
    directory (``site`` and its ``.pth`` files cost the wrapper as much as the rest of its
    start); through ``-m`` otherwise."""
    python = os.path.abspath(sys.executable)
    root = package_root()
    if root is None:
        return [python, "-I", "-m", WRAPPER_MODULE, ruleset_path, *argv]
    return [python, "-I", "-S", "-c", BOOT, root, ruleset_path, *argv]


def _touch_private(path: str) -> None:
    # The guard appends to its log; a file rule needs the file to exist before the spawn.
    with contextlib.suppress(OSError):
        os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_NOFOLLOW, 0o600))


def prepare(conf: rules.Confinement, argv: Sequence[str], env: Mapping[str, str]) -> Prepared:
    """Write the ruleset of one run and wrap its argv; :func:`cleanup` after the run."""
    private_tmp = tempfile.mkdtemp(prefix="agentcall-run-")
    try:
        for path in conf.append_files:
            _touch_private(path)
        for path in conf.agent_state:
            # Inside a home opened child by child the agent could not create it itself.
            with contextlib.suppress(OSError):
                os.makedirs(path, mode=0o700, exist_ok=True)
        search_path = env.get("PATH", os.defpath)
        program = argv[0] if os.sep in argv[0] else shutil.which(argv[0], path=search_path)
        runtime = list(conf.runtime)
        if program:
            runtime += needs.program_paths(program, search_path)
        guard_read, guard_list = needs.guard_runtime()
        full = conf._replace(
            runtime=tuple(dict.fromkeys(runtime + guard_read)),
            runtime_list=tuple(dict.fromkeys([*conf.runtime_list, *guard_list])),
        )
        planned = rules.plan(full, OsView(), private_tmp=private_tmp)
        ruleset = os.path.join(private_tmp, RULESET_NAME)
        data = encode_ruleset(planned)
        fd = os.open(ruleset, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
        with os.fdopen(fd, "wb") as out:
            out.write(data)
    except BaseException:
        cleanup(private_tmp)
        raise
    wrapped_env = dict(env)
    wrapped_env["TMPDIR"] = private_tmp
    # The wrapper asks the kernel to kill the run if this process dies (and drops the name).
    wrapped_env[PARENT_ENV] = str(os.getpid())
    return Prepared(tuple(wrapper_argv(ruleset, argv)), wrapped_env, private_tmp)


def cleanup(private_tmp: str) -> None:
    """Remove a run's private temporary directory and whatever the agent left in it."""
    shutil.rmtree(private_tmp, ignore_errors=True)
