"""What an answering agent may read and write: read roots, one write root, and a denylist.

The denylist is built in and cannot be narrowed by any configuration: credential stores and
agent configuration under the owner's home, shell start-up files (a write there runs code at
the owner's next login), ``.env`` files and private-key files anywhere, plus the extra roots the
caller names (the guard's own code and the tasks directory, so a write cannot switch off the
next call's guard or rewrite the owner's task rules).

Every decision is taken on a canonical path: ``~`` expanded against the owner's home, made
absolute against the tool call's cwd, symlinks resolved (the real path of the longest existing
prefix, then the rest), ``..`` collapsed, and case-folded for comparison on a case-insensitive
file system. Checks against the denylist always compare case-folded, which only ever refuses
more.

This module is imported by the tool guard on every tool call, so it uses the standard library
only and does no work at import time.
"""

from __future__ import annotations

import os
import re
import sys

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Iterable

# Under the owner's home; each entry is refused together with everything below it.
DENIED_UNDER_HOME: tuple[str, ...] = (
    ".ssh",
    ".gnupg",
    ".aws",
    ".azure",
    ".config/gcloud",
    ".kube",
    ".docker/config.json",
    "Library/Keychains",
    ".agentcall",
    ".claude",
    ".codex",
    ".claude.json",
    ".config/systemd/user",
    "Library/LaunchAgents",
    ".netrc",
    ".npmrc",
    ".pypirc",
    ".git-credentials",
    # Shell start-up files: whoever writes one runs code in the owner's next shell.
    ".bashrc",
    ".bash_profile",
    ".profile",
    ".zshrc",
    ".zprofile",
    ".zshenv",
    ".config/fish",
)

PRIVATE_KEY_NAMES = frozenset(
    {"id_rsa", "id_ed25519", "id_ecdsa", "id_dsa", "id_ed25519_sk", "id_ecdsa_sk"}
)
PRIVATE_KEY_SUFFIXES = (".pem", ".key", ".p12", ".pfx")
# Committed templates hold no secrets by convention; every other .env.* is refused.
ENV_TEMPLATES = frozenset({".env.example", ".env.sample", ".env.template"})

# Shell words are split on blanks, quotes and operators; what is left may be a path.
_SHELL_SPLIT = re.compile(r"[\s'\"`;|&<>(){}=,]+")
_HOME_VARIABLE = re.compile(r"^\$HOME\b")


class ScopeError(ValueError):
    """A path that cannot be canonicalised (NUL byte, not a string)."""


class Verdict:
    """One decision: ``allowed`` and the name of the rule that decided it."""

    __slots__ = ("allowed", "rule")

    def __init__(self, allowed: bool, rule: str) -> None:
        self.allowed = allowed
        self.rule = rule

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Verdict):
            return NotImplemented
        return (self.allowed, self.rule) == (other.allowed, other.rule)

    def __hash__(self) -> int:
        return hash((self.allowed, self.rule))

    def __repr__(self) -> str:
        return f"Verdict(allowed={self.allowed!r}, rule={self.rule!r})"


def is_denied_name(name: str) -> bool:
    """Whether one path component is a credential file name (case-insensitively)."""
    folded = name.casefold()
    if folded == ".env" or (folded.startswith(".env.") and folded not in ENV_TEMPLATES):
        return True
    return folded in PRIVATE_KEY_NAMES or folded.endswith(PRIVATE_KEY_SUFFIXES)


def within(path: str, root: str) -> bool:
    """Whether canonical ``path`` is ``root`` or below it (both already in the same case)."""
    if path == root:
        return True
    prefix = root if root.endswith(os.sep) else root + os.sep
    return path.startswith(prefix)


def filesystem_ignores_case(probe: str) -> bool:
    """Whether the file system holding ``probe`` (an existing path) ignores case.

    macOS and Windows default to case-insensitive volumes; elsewhere the answer comes from
    looking ``probe`` up with its last component's case swapped.
    """
    if sys.platform in ("darwin", "win32"):
        return True
    head, tail = os.path.split(probe.rstrip(os.sep))
    swapped = tail.swapcase()
    if not tail or swapped == tail:
        return False
    try:
        return os.path.samestat(os.stat(probe), os.stat(os.path.join(head, swapped)))
    except OSError:
        return False


def expand_home(path: str, home: str) -> str:
    """``~`` and ``~/x`` against the owner's home; ``~user`` from the password database."""
    if path == "~" or path.startswith("~/"):
        return home + path[1:]
    if path.startswith("~"):
        return os.path.expanduser(path)
    return path


def canonical(path: str, *, cwd: str, home: str) -> str:
    """The absolute, symlink-free, normalised form of ``path`` (the tail need not exist).

    ``os.path.realpath`` without ``strict`` resolves the existing prefix component by
    component (so ``link/..`` means the link target's parent, as the kernel sees it) and
    keeps the missing rest as written, collapsing ``..`` lexically there.
    """
    if not isinstance(path, str) or "\0" in path or not path:
        raise ScopeError("not a usable path")
    expanded = expand_home(path, home)
    if not os.path.isabs(expanded):
        expanded = os.path.join(cwd, expanded)
    return os.path.realpath(expanded)


class Scope:
    """Read roots, the built-in denylist and extra denied roots for one owner.

    Paths given here are canonicalised once; ``case_insensitive`` is detected from the home
    directory unless given (tests simulate a macOS volume with ``True``).
    """

    def __init__(
        self,
        read_roots: Iterable[str],
        extra_denied: Iterable[str],
        home: str,
        *,
        case_insensitive: bool | None = None,
    ) -> None:
        if not isinstance(home, str) or not os.path.isabs(home):
            raise ScopeError("home must be an absolute path")
        self.home = home
        self.real_home = os.path.realpath(home)
        self.case_insensitive = (
            filesystem_ignores_case(self.real_home)
            if case_insensitive is None
            else case_insensitive
        )
        self.read_roots = tuple(self._root(r) for r in read_roots)
        # Both the path as written and its real path: a denied directory that is itself a
        # symlink must be refused under either name.
        self._denied_home = self._both_forms(os.path.join(home, d) for d in DENIED_UNDER_HOME)
        self._denied_extra = self._both_forms(self._absolute(p) for p in extra_denied)

    # --- canonical forms ---------------------------------------------------------------------

    def _absolute(self, path: str) -> str:
        expanded = expand_home(path, self.home)
        if not os.path.isabs(expanded) or "\0" in expanded:
            raise ScopeError("configured paths must be absolute")
        return expanded

    def _root(self, path: str) -> str:
        return os.path.realpath(self._absolute(path))

    @staticmethod
    def _both_forms(paths: Iterable[str]) -> tuple[str, ...]:
        forms: dict[str, None] = {}
        for path in paths:
            forms[os.path.normpath(path).casefold()] = None
            forms[os.path.realpath(path).casefold()] = None
        return tuple(forms)

    def canonical(self, path: str, cwd: str | None = None) -> str:
        """``path`` in canonical form, relative paths taken against ``cwd``."""
        return canonical(path, cwd=cwd or os.getcwd(), home=self.home)

    def _key(self, path: str) -> str:
        return path.casefold() if self.case_insensitive else path

    # --- decisions ---------------------------------------------------------------------------

    def denied_rule(self, canonical_path: str) -> str | None:
        """The denylist rule that refuses a canonical path, or None."""
        folded = canonical_path.casefold()
        if any(within(folded, denied) for denied in self._denied_home):
            return "denied-home-path"
        if any(within(folded, denied) for denied in self._denied_extra):
            return "denied-root"
        if any(is_denied_name(part) for part in canonical_path.split(os.sep) if part):
            return "denied-name"
        return None

    def check_read(self, path: str, cwd: str | None = None) -> Verdict:
        """May the agent read ``path``: not denied, and inside one of the read roots."""
        target = self.canonical(path, cwd)
        rule = self.denied_rule(target)
        if rule is not None:
            return Verdict(False, rule)
        key = self._key(target)
        if any(within(key, self._key(root)) for root in self.read_roots):
            return Verdict(True, "inside-read-roots")
        return Verdict(False, "outside-read-roots")

    def check_write(self, path: str, write_root: str | None, cwd: str | None = None) -> Verdict:
        """May the agent write ``path``: not denied, and inside ``write_root``."""
        target = self.canonical(path, cwd)
        rule = self.denied_rule(target)
        if rule is not None:
            return Verdict(False, rule)
        if not write_root:
            return Verdict(False, "no-write-root")
        if within(self._key(target), self._key(self._root(write_root))):
            return Verdict(True, "inside-write-root")
        return Verdict(False, "outside-write-root")

    def is_ancestor_of_denied(self, path: str, cwd: str | None = None) -> bool:
        """Whether a search rooted at ``path`` would walk into a denied home path or root.

        ``~`` and ``/`` are ancestors of ``~/.ssh``; so is the denied path itself. Denied
        *names* (``.env`` anywhere) cannot be found this way without listing the tree.
        """
        folded = self.canonical(path, cwd).casefold()
        return any(within(denied, folded) for denied in self._denied_home + self._denied_extra)

    def denied_paths_mentioned(self, command_text: str, cwd: str | None = None) -> list[str]:
        """The words of a shell command that name a denied path, for the record.

        Literal absolute paths, ``~/…`` and ``$HOME/…`` forms are recognised; relative words
        are checked for denied names, and against ``cwd`` when it is given. This is a flag for
        the owner, not a bound: a shell can name a file in endless other ways.
        """
        mentioned: dict[str, None] = {}
        for word in _SHELL_SPLIT.split(command_text.replace("${HOME}", "$HOME")):
            if word and self._word_is_denied(word, cwd):
                mentioned[word] = None
        return list(mentioned)

    def _word_is_denied(self, word: str, cwd: str | None) -> bool:
        if "\0" in word:
            return False
        path = _HOME_VARIABLE.sub(lambda _m: self.home, word, count=1)
        path = expand_home(path, self.home)
        if any(is_denied_name(part) for part in path.split(os.sep) if part):
            return True
        if not os.path.isabs(path):
            if cwd is None:
                return False
            path = os.path.join(cwd, path)
        folded = os.path.normpath(path).casefold()
        return any(within(folded, d) for d in self._denied_home + self._denied_extra)
