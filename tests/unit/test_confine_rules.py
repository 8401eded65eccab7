"""The plan of the kernel boundary with plain values: which paths get which rights."""

from __future__ import annotations

import os

import pytest

from agentcall.confine import rights, rules
from agentcall.confine.rights import APPEND, DEVICE, LIST, READ, WRITE
from agentcall.confine.rules import Confinement
from agentcall.guard.scope import DENIED_UNDER_HOME

HOME = "/h"


class FakeView:
    """A file system as a dict of directory -> names, plus symlinks and plain files."""

    def __init__(
        self,
        dirs: dict[str, list[str]],
        files: frozenset[str] | set[str] = frozenset(),
        links: dict[str, str] | None = None,
    ) -> None:
        self.dirs = dirs
        self.files = set(files)
        self.links = links or {}

    def realpath(self, path: str) -> str:
        path = os.path.normpath(path)
        for _ in range(10):
            for link, target in self.links.items():
                if path == link or path.startswith(link + "/"):
                    path = target + path[len(link) :]
                    break
            else:
                return path
        return path

    def exists(self, path: str) -> bool:
        real = self.realpath(path)
        return real in self.dirs or real in self.files

    def listdir(self, path: str) -> list[str]:
        return list(self.dirs.get(self.realpath(path), []))


def home_view(**extra_dirs: list[str]) -> FakeView:
    dirs = {
        "/h": [".ssh", ".aws", ".bashrc", ".env", "project", "notes.txt", ".config", "id_rsa"],
        "/h/.ssh": ["id_ed25519"],
        "/h/.aws": [],
        "/h/project": ["src"],
        "/h/project/src": [],
        "/h/.config": ["gcloud", "git"],
        "/h/.config/gcloud": [],
        "/h/.config/git": [],
        "/usr": [],
        "/etc": [],
        "/dev": ["shm", "mqueue", "null", "pts", "fd"],
        "/dev/shm": [],
        "/dev/mqueue": [],
        "/dev/pts": [],
        "/proc": ["self", "1", "4242", "cpuinfo", "sys"],
        "/proc/4242": ["environ"],
        "/proc/cpuinfo": [],
        "/proc/sys": [],
        "/run": ["user", "systemd", "resolvconf", "host"],
        "/run/host": [],
        "/run/user": ["1000"],
        "/run/systemd": [],
        "/run/resolvconf": [],
    }
    dirs.update(extra_dirs)
    view = FakeView(
        dirs,
        {"/h/.bashrc", "/h/.env", "/h/notes.txt", "/h/id_rsa", "/h/.ssh/id_ed25519", "/dev/null"},
    )
    # As the listener sees them: /proc/self is the listener's own directory.
    view.links["/proc/self"] = "/proc/4242"
    view.links["/dev/fd"] = "/proc/self/fd"
    return view


def kinds(planned: list[tuple[str, str]]) -> dict[str, set[str]]:
    found: dict[str, set[str]] = {}
    for path, kind in planned:
        found.setdefault(path, set()).add(kind)
    return found


def test_a_root_without_denied_entries_is_granted_whole() -> None:
    planned = kinds(rules.plan(Confinement(("/h/project",), (), HOME), home_view()))
    assert planned["/h/project"] == {READ}
    assert "/h/project/src" not in planned
    assert "/h" not in planned


def test_the_home_as_a_root_is_opened_child_by_child_without_the_denied_entries() -> None:
    """~/.ssh, ~/.aws, ~/.bashrc and ~/.config/gcloud are denylisted; .env and id_rsa are
    credential names; everything else is granted, and the way down may only be listed."""
    planned = kinds(rules.plan(Confinement((HOME,), (), HOME), home_view()))
    assert planned["/h"] == {LIST}
    assert planned["/h/project"] == {READ}
    assert planned["/h/notes.txt"] == {READ}
    assert planned["/h/.config"] == {LIST}
    assert planned["/h/.config/git"] == {READ}
    for denied in ("/h/.ssh", "/h/.aws", "/h/.bashrc", "/h/.config/gcloud", "/h/.env", "/h/id_rsa"):
        assert denied not in planned, denied
    assert not any(p.startswith("/h/.ssh/") for p in planned)


def test_a_root_inside_a_denied_directory_gets_nothing() -> None:
    planned = kinds(rules.plan(Confinement(("/h/.ssh",), ("/h/.aws",), HOME), home_view()))
    assert not any(p.startswith(("/h/.ssh", "/h/.aws")) for p in planned)


def test_a_symlink_to_a_denied_directory_is_not_followed_into_it() -> None:
    view = home_view()
    view.dirs["/h/project"] = ["src", "keys"]
    view.links["/h/project/keys"] = "/h/.ssh"
    planned = kinds(rules.plan(Confinement((HOME,), (), HOME), view))
    # The project itself is granted whole: Landlock checks the link's target, ~/.ssh.
    assert planned["/h/project"] == {READ}
    assert "/h/.ssh" not in planned


def test_a_root_that_is_a_symlink_to_home_is_opened_like_home() -> None:
    view = home_view(**{"/w": ["link"]})
    view.links["/w/link"] = HOME
    planned = kinds(rules.plan(Confinement(("/w/link",), (), HOME), view))
    assert planned["/h"] == {LIST}
    assert "/h/.ssh" not in planned


def test_a_denied_directory_that_is_a_symlink_is_refused_under_its_real_name_too() -> None:
    view = home_view(**{"/vault": ["id_ed25519"]})
    view.links["/h/.ssh"] = "/vault"
    planned = kinds(rules.plan(Confinement(("/vault",), (), HOME), view))
    assert "/vault" not in planned


def test_writes_go_only_to_the_write_roots_the_temp_dir_and_the_agent_state() -> None:
    view = home_view(**{"/h/.claude": [], "/t": []})
    view.files.add("/h/.claude.json")
    view.files.add("/s/tools.log")
    conf = Confinement(
        ("/h/project",),
        ("/h/project/src",),
        HOME,
        agent_state=("/h/.claude",),
        agent_files=("/h/.claude.json",),
        append_files=("/s/tools.log",),
    )
    planned = kinds(rules.plan(conf, view, private_tmp="/t"))
    writable = {p for p, k in planned.items() if WRITE in k}
    assert writable == {"/h/project/src", "/h/.claude", "/h/.claude.json", "/t"}
    assert planned["/s/tools.log"] == {APPEND}
    assert planned["/dev/null"] == {DEVICE}
    assert planned["/usr"] == {READ}


def test_shared_memory_and_the_owners_session_directory_are_left_out() -> None:
    """/dev/shm and /dev/mqueue outlive the run and are shared with all of the owner's
    processes; /run/user holds the owner's session. Their parents are only listed, and a
    link in them (/dev/fd) is not granted as a link."""
    planned = kinds(rules.plan(Confinement((), (), HOME), home_view()))
    assert planned["/dev"] == planned["/run"] == {LIST}
    for left_out in (
        "/dev/shm",
        "/dev/mqueue",
        "/dev/pts",  # the owner's terminals
        "/run/user",
        "/run/user/1000",
        "/run/host",
        "/dev/fd",
    ):
        assert left_out not in planned, left_out
    assert planned["/run/systemd"] == planned["/run/resolvconf"] == {READ}


def test_of_proc_only_the_runs_own_directory_and_machine_wide_files_are_read() -> None:
    """/proc/self goes to the wrapper as written (there it is the agent's own pid); the
    listener's directory, /proc itself and other pids are never granted."""
    planned = kinds(rules.plan(Confinement((), (), HOME), home_view()))
    proc = {p for p in planned if p == "/proc" or p.startswith("/proc/")}
    assert proc == {"/proc/self", "/proc/cpuinfo", "/proc/sys"}
    assert all(planned[p] == {READ} for p in proc)


def test_a_denylisted_agent_state_is_granted_while_extras_follow_the_denylist() -> None:
    """The agent's own ~/.claude is on the guard's list but the agent needs it; an owner's
    extra path is held to the denylist like a root."""
    view = home_view(**{"/h/.claude": []})
    conf = Confinement((), (), HOME, agent_state=("/h/.claude",), extra=(HOME,))
    planned = kinds(rules.plan(conf, view))
    assert planned["/h/.claude"] == {WRITE}
    assert planned["/h/project"] == {WRITE}
    assert "/h/.ssh" not in planned


def test_missing_paths_are_left_out() -> None:
    conf = Confinement(("/nowhere",), ("/gone",), HOME, agent_files=("/h/.claude.json",))
    planned = kinds(rules.plan(conf, home_view()))
    assert not {"/nowhere", "/gone", "/h/.claude.json", "/lib64"} & set(planned)


def test_runtime_is_read_and_search_path_directories_only_listed() -> None:
    view = home_view(**{"/opt/venv": [], "/repo": ["agentcall"], "/repo/agentcall": []})
    conf = Confinement(
        (), (), HOME, runtime=("/opt/venv", "/repo/agentcall"), runtime_list=("/repo",)
    )
    planned = kinds(rules.plan(conf, view))
    assert planned["/opt/venv"] == {READ}
    assert planned["/repo/agentcall"] == {READ}
    assert planned["/repo"] == {LIST}


def test_trusted_ca_files_are_read_whatever_their_name_but_never_in_a_denied_directory() -> None:
    view = home_view(**{"/h/certs": ["corp.pem", "key.pem"]})
    view.files |= {"/h/certs/corp.pem", "/h/certs/key.pem", "/h/.ssh/ca.pem"}
    conf = Confinement(
        (), (), HOME, trust=("/h/certs/corp.pem", "/h/.ssh/ca.pem", "/h/.ssh", "/h/missing.pem")
    )
    planned = kinds(rules.plan(conf, view))
    assert planned["/h/certs/corp.pem"] == {READ}
    # Only the file named: its neighbours, the denied directory and what is in it stay out.
    assert not {"/h/certs", "/h/certs/key.pem", "/h/.ssh", "/h/.ssh/ca.pem"} & set(planned)
    assert "/h/missing.pem" not in planned


def test_a_runtime_in_the_home_itself_does_not_open_the_home() -> None:
    planned = kinds(rules.plan(Confinement((), (), HOME, runtime=(HOME,)), home_view()))
    assert planned["/h"] == {LIST}
    assert "/h/.ssh" not in planned


def test_every_denylist_entry_is_kept_out_of_a_home_root() -> None:
    names = sorted({d.split("/")[0] for d in DENIED_UNDER_HOME})
    dirs = {"/h": [*names, "ok"], "/h/ok": []}
    for name in names:
        dirs[f"/h/{name}"] = [
            sub.split("/")[1] for sub in DENIED_UNDER_HOME if sub.startswith(name + "/")
        ]
        for sub in dirs[f"/h/{name}"]:
            dirs[f"/h/{name}/{sub}"] = []
    planned = kinds(rules.plan(Confinement((HOME,), (), HOME), FakeView(dirs)))
    for entry in DENIED_UNDER_HOME:
        assert os.path.join(HOME, entry) not in planned, entry
    assert planned["/h/ok"] == {READ}


def test_depth_is_bounded() -> None:
    deep = "/h/" + "/".join(["d"] * 30)
    dirs: dict[str, list[str]] = {"/h": ["d"]}
    path = "/h"
    for _ in range(30):
        path += "/d"
        dirs[path] = ["d"]
    # A denylisted entry at the bottom forces the planner all the way down.
    planned = rules.plan(Confinement((HOME,), (), "/h/" + "/".join(["d"] * 29)), FakeView(dirs))
    assert len(planned) <= rules.MAX_DEPTH + 5
    assert deep not in dict(planned)


@pytest.mark.parametrize(
    ("abi", "expected"),
    [
        (0, 0),
        (1, (1 << 13) - 1),
        (2, (1 << 14) - 1),
        (3, (1 << 15) - 1),
        (4, (1 << 15) - 1),
        (5, (1 << 16) - 1),
        (7, (1 << 16) - 1),
    ],
)
def test_handled_rights_follow_the_abi(abi: int, expected: int) -> None:
    assert rights.handled_rights(abi) == expected


@pytest.mark.parametrize("kind", rights.KINDS)
@pytest.mark.parametrize("abi", [1, 2, 3, 5, 7])
def test_rights_never_exceed_what_the_abi_handles_and_files_get_file_rights(
    kind: str, abi: int
) -> None:
    on_dir = rights.rights_for(kind, abi, is_dir=True)
    on_file = rights.rights_for(kind, abi, is_dir=False)
    assert on_dir & ~rights.handled_rights(abi) == 0
    assert on_file & ~rights.FILE_RIGHTS == 0
    assert on_file & ~on_dir == 0


def test_what_each_kind_allows() -> None:
    assert rights.rights_for(LIST, 7, is_dir=True) == rights.READ_DIR
    assert rights.rights_for(LIST, 7, is_dir=False) == 0
    assert rights.rights_for(APPEND, 7, is_dir=False) == rights.WRITE_FILE
    read = rights.rights_for(READ, 7, is_dir=True)
    assert read & rights.READ_FILE and not read & (rights.WRITE_FILE | rights.MAKE_REG)
    write = rights.rights_for(WRITE, 7, is_dir=True)
    assert write & rights.MAKE_REG and write & rights.REFER and write & rights.TRUNCATE
    assert not write & (rights.MAKE_CHAR | rights.MAKE_BLOCK)
    assert rights.rights_for(WRITE, 1, is_dir=True) & (rights.REFER | rights.TRUNCATE) == 0
    assert rights.rights_for(DEVICE, 5, is_dir=False) & rights.IOCTL_DEV


def test_an_unknown_kind_is_refused() -> None:
    with pytest.raises(ValueError, match="unknown access kind"):
        rights.rights_for("everything", 7, is_dir=True)


def test_the_guards_extra_denied_roots_stay_out_of_roots_but_not_the_runtime() -> None:
    """The owner's tasks directory inside a write root is not writable; the guard's own
    package stays readable to the guard (runtime) while no root grants it."""
    view = home_view(**{"/h/project/tasks": [], "/pkg": []})
    view.dirs["/h/project"] = ["src", "tasks"]
    conf = Confinement(
        (), ("/h/project",), HOME, runtime=("/pkg",), denied_extra=("/h/project/tasks", "/pkg")
    )
    planned = kinds(rules.plan(conf, view))
    assert planned["/h/project"] == {LIST}
    assert planned["/h/project/src"] == {WRITE}
    assert "/h/project/tasks" not in planned
    assert planned["/pkg"] == {READ}
