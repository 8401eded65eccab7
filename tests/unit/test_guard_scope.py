"""Read scope and denylist: canonical paths, symlinks, ``..``, credential names, extra roots."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

from agentcall.guard.scope import (
    DENIED_UNDER_HOME,
    Scope,
    ScopeError,
    Verdict,
    canonical,
    filesystem_ignores_case,
    is_denied_name,
)


@pytest.fixture
def home(tmp_path: Path) -> Path:
    """An owner's home: a project, credentials, and an outside directory next to it."""
    home = tmp_path / "home"
    (home / ".ssh").mkdir(parents=True)
    (home / ".ssh" / "id_ed25519").write_text("KEY")
    (home / ".config").mkdir()
    proj = home / "proj"
    (proj / "sub").mkdir(parents=True)
    (proj / "notes.txt").write_text("notes")
    for name in (".env", ".env.local", ".env.example", ".env.sample", ".env.template"):
        (proj / name).write_text("X=1")
    outside = tmp_path / "outside"
    (outside / "deep").mkdir(parents=True)
    (outside / "secret.txt").write_text("s")
    (proj / "key_link").symlink_to(home / ".ssh" / "id_ed25519")
    (proj / "out_link").symlink_to(outside / "secret.txt")
    (proj / "dir_link").symlink_to(outside / "deep")
    (proj / "dangling_rc").symlink_to(home / ".bashrc")
    (proj / "dangling_out").symlink_to(outside / "new.txt")
    (tmp_path / "pkg" / "agentcall").mkdir(parents=True)
    (home / "AgentCall" / "tasks").mkdir(parents=True)
    return home


def make_scope(home: Path, **kw: object) -> Scope:
    extra = [str(home.parent / "pkg" / "agentcall"), str(home / "AgentCall" / "tasks")]
    roots = kw.pop("roots", [str(home)])
    return Scope(roots, extra, str(home), case_insensitive=kw.pop("ci", False))  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("path", "expected"),
    [
        ("proj/notes.txt", Verdict(True, "inside-read-roots")),
        ("~/proj/notes.txt", Verdict(True, "inside-read-roots")),
        ("~/.ssh/id_ed25519", Verdict(False, "denied-home-path")),
        ("~/.ssh", Verdict(False, "denied-home-path")),
        ("proj/.env", Verdict(False, "denied-name")),
        ("proj/.env.local", Verdict(False, "denied-name")),
        ("proj/.ENV", Verdict(False, "denied-name")),
        ("proj/.env.example", Verdict(True, "inside-read-roots")),
        ("proj/.env.sample", Verdict(True, "inside-read-roots")),
        ("proj/.env.template", Verdict(True, "inside-read-roots")),
        ("proj/server.pem", Verdict(False, "denied-name")),
        ("proj/tls.key", Verdict(False, "denied-name")),
        ("proj/cert.p12", Verdict(False, "denied-name")),
        ("proj/cert.pfx", Verdict(False, "denied-name")),
        ("proj/backup/id_rsa", Verdict(False, "denied-name")),
        ("proj/id_dsa", Verdict(False, "denied-name")),
        ("proj/id_rsa.pub", Verdict(True, "inside-read-roots")),
        ("proj/.env/inside", Verdict(False, "denied-name")),
        # Symlinks are resolved before any comparison.
        ("proj/key_link", Verdict(False, "denied-home-path")),
        ("proj/out_link", Verdict(False, "outside-read-roots")),
        # dir_link/.. is the link target's parent (outside), not proj.
        ("proj/dir_link/../secret.txt", Verdict(False, "outside-read-roots")),
        ("proj/../../outside/secret.txt", Verdict(False, "outside-read-roots")),
        ("proj/sub/../../.ssh/config", Verdict(False, "denied-home-path")),
        ("proj/missing/../../.aws/credentials", Verdict(False, "denied-home-path")),
        ("proj/missing/deeper/file.txt", Verdict(True, "inside-read-roots")),
        (".bashrc", Verdict(False, "denied-home-path")),
        (".config/fish/config.fish", Verdict(False, "denied-home-path")),
        (".config/gcloud/credentials.db", Verdict(False, "denied-home-path")),
        (".config/other.toml", Verdict(True, "inside-read-roots")),
        (".docker/config.json", Verdict(False, "denied-home-path")),
        (".docker/other.json", Verdict(True, "inside-read-roots")),
        (".claude.json", Verdict(False, "denied-home-path")),
        (".claude/settings.json", Verdict(False, "denied-home-path")),
        (".agentcall/keys.json", Verdict(False, "denied-home-path")),
        ("Library/Keychains/login.keychain-db", Verdict(False, "denied-home-path")),
        (".git-credentials", Verdict(False, "denied-home-path")),
        ("AgentCall/tasks/ask/SKILL.md", Verdict(False, "denied-root")),
        ("../pkg/agentcall/guard/main.py", Verdict(False, "denied-root")),
        ("/etc/hostname", Verdict(False, "outside-read-roots")),
    ],
)
def test_check_read(home: Path, path: str, expected: Verdict) -> None:
    """Each path, relative to home as cwd, gets the verdict and rule shown."""
    assert make_scope(home).check_read(path, cwd=str(home)) == expected


def test_every_builtin_home_entry_is_refused(home: Path) -> None:
    """The built-in list cannot be missed: each entry and a file below it are refused."""
    scope = make_scope(home)
    for entry in DENIED_UNDER_HOME:
        assert scope.check_read(str(home / entry)).rule == "denied-home-path", entry
        assert not scope.check_read(str(home / entry / "x")).allowed, entry


def test_roots_limit_reads(home: Path) -> None:
    """With only the project as root, the rest of home is outside."""
    scope = make_scope(home, roots=[str(home / "proj")])
    assert scope.check_read(str(home / "proj" / "notes.txt")).allowed
    assert scope.check_read(str(home / "other.txt")) == Verdict(False, "outside-read-roots")
    # A sibling whose name starts with the root's name is not inside it.
    assert not scope.check_read(str(home / "project2" / "x")).allowed
    assert not make_scope(home, roots=[]).check_read(str(home / "proj" / "notes.txt")).allowed


def test_denylist_wins_over_a_root_inside_it(home: Path) -> None:
    """Naming ~/.ssh as a read root does not make it readable."""
    scope = make_scope(home, roots=[str(home / ".ssh")])
    assert scope.check_read(str(home / ".ssh" / "id_ed25519")).rule == "denied-home-path"


def test_symlinked_home_is_denied_under_both_names(tmp_path: Path) -> None:
    """When home itself is a symlink, its credentials are refused by either spelling."""
    real = tmp_path / "real"
    (real / ".aws").mkdir(parents=True)
    link = tmp_path / "link"
    link.symlink_to(real)
    scope = Scope([str(link)], [], str(link), case_insensitive=False)
    assert scope.check_read(str(real / ".aws" / "credentials")).rule == "denied-home-path"
    assert scope.check_read(str(link / ".aws" / "credentials")).rule == "denied-home-path"
    assert scope.check_read(str(link / "notes")).allowed


def test_case_folding_on_a_case_insensitive_volume(home: Path) -> None:
    """Simulated macOS: PROJ is proj for roots; the denylist folds case everywhere."""
    insensitive = make_scope(home, roots=[str(home / "proj")], ci=True)
    sensitive = make_scope(home, roots=[str(home / "proj")], ci=False)
    upper = str(home / "PROJ" / "notes.txt")
    assert insensitive.check_read(upper) == Verdict(True, "inside-read-roots")
    assert sensitive.check_read(upper) == Verdict(False, "outside-read-roots")
    for scope in (insensitive, sensitive):
        assert scope.check_read(str(home / ".SSH" / "id_ed25519")).rule == "denied-home-path"
        assert scope.check_read(str(home / "Proj" / "ID_RSA")).rule == "denied-name"


def test_check_write(home: Path) -> None:
    """Writes need the write root; denied paths and escapes through symlinks are refused."""
    scope = make_scope(home)
    root = str(home / "proj")
    assert scope.check_write("proj/answer.md", root, cwd=str(home)) == Verdict(
        True, "inside-write-root"
    )
    assert scope.check_write("proj/.env", root, cwd=str(home)).rule == "denied-name"
    assert scope.check_write("notes.md", root, cwd=str(home)).rule == "outside-write-root"
    assert scope.check_write("proj/answer.md", None, cwd=str(home)).rule == "no-write-root"
    # A dangling link: the write would create the target, so the target is judged.
    assert scope.check_write("proj/dangling_rc", root, cwd=str(home)).rule == "denied-home-path"
    assert scope.check_write("proj/dangling_out", root, cwd=str(home)).rule == (
        "outside-write-root"
    )
    assert scope.check_write("proj/../.zshrc", root, cwd=str(home)).rule == "denied-home-path"


def test_write_root_covering_the_guard_code_still_refuses_it(home: Path) -> None:
    """Extra denied roots hold even inside the write root."""
    scope = make_scope(home)
    pkg = home.parent / "pkg" / "agentcall" / "guard" / "main.py"
    assert scope.check_write(str(pkg), str(home.parent)).rule == "denied-root"


@pytest.mark.parametrize(
    ("path", "expected"),
    [
        ("~", True),
        ("/", True),
        ("~/.config", True),
        ("~/.ssh", True),
        # Inside is not an ancestor: check_read refuses that one.
        ("~/.ssh/sub", False),
        ("~/AgentCall", True),
        ("~/proj", False),
        ("~/proj/sub", False),
        ("~/.configx", False),
    ],
)
def test_ancestor_of_denied(home: Path, path: str, expected: bool) -> None:
    """A search rooted at home, / or a denied directory would reach a denied path."""
    assert make_scope(home).is_ancestor_of_denied(path) is expected


@pytest.mark.parametrize(
    ("command", "expected"),
    [
        ("cat ~/.ssh/id_ed25519", ["~/.ssh/id_ed25519"]),
        ("cat $HOME/.aws/credentials | head", ["$HOME/.aws/credentials"]),
        ('cat "${HOME}/.netrc"', ["$HOME/.netrc"]),
        ("cp x ~/.bashrc && echo ok", ["~/.bashrc"]),
        ("cat .env", [".env"]),
        ("openssl x509 -in server.pem", ["server.pem"]),
        ("tar czf x.tgz --exclude=.env.local .", [".env.local"]),
        ("cat .env.example", []),
        ("ls -la; cat notes.txt", []),
        ("cat ~/.sshx/file", []),
        ("echo ~", []),
    ],
)
def test_denied_paths_mentioned(home: Path, command: str, expected: list[str]) -> None:
    """Literal, ~ and $HOME forms and credential names are flagged; the rest is not."""
    assert make_scope(home).denied_paths_mentioned(command) == expected


def test_denied_paths_mentioned_absolute_and_relative(home: Path) -> None:
    """Absolute home paths, and relative ones when the cwd is known."""
    scope = make_scope(home)
    absolute = f"cat {home}/.kube/config"
    assert scope.denied_paths_mentioned(absolute) == [f"{home}/.kube/config"]
    assert scope.denied_paths_mentioned("cat .ssh/config", cwd=str(home)) == [".ssh/config"]
    assert scope.denied_paths_mentioned("cat .ssh/config") == []
    assert scope.denied_paths_mentioned("cat AgentCall/tasks/x", cwd=str(home)) == [
        "AgentCall/tasks/x"
    ]


def test_canonical_expands_and_refuses_garbage(home: Path) -> None:
    """~ goes to the owner's home (not this process's); NUL and empty paths are refused."""
    got = canonical("~/proj/./sub//x", cwd="/nowhere", home=str(home))
    assert got == str(home / "proj" / "sub" / "x")
    assert canonical("rel", cwd=str(home), home=str(home)) == str(home / "rel")
    for bad in ("", "a\0b"):
        with pytest.raises(ScopeError):
            canonical(bad, cwd=str(home), home=str(home))
    with pytest.raises(ScopeError):
        Scope(["relative"], [], str(home))
    with pytest.raises(ScopeError):
        Scope([], [], "relative-home")


@pytest.mark.parametrize(
    ("name", "denied"),
    [
        (".env", True),
        (".env.production", True),
        (".Env.Example", False),
        ("env", False),
        (".envrc", False),
        ("id_ed25519", True),
        ("id_ed25519.pub", False),
        ("my.KEY", True),
        ("keys.txt", False),
    ],
)
def test_denied_names(name: str, denied: bool) -> None:
    """Credential names are recognised case-insensitively; look-alikes are not."""
    assert is_denied_name(name) is denied


@pytest.mark.skipif(sys.platform in ("darwin", "win32"), reason="case-insensitive by default")
def test_case_sensitivity_detected_on_this_volume(tmp_path: Path) -> None:
    """A Linux temp directory is case-sensitive; a volume that folds case is detected."""
    probe = tmp_path / "Probe"
    probe.mkdir()
    assert not filesystem_ignores_case(str(probe))
    # Simulate folding: the swapped-case name exists and is the same directory.
    (tmp_path / "pROBE").symlink_to(probe)
    assert filesystem_ignores_case(str(probe))
    assert os.path.isdir(tmp_path / "pROBE")
