"""Generated code kept between runs of a process that places one call.

attrs writes the methods of every class it makes (``__init__``, ``__eq__``, ``__repr__``...) as
source and compiles it; cattrs does the same for each structure and unstructure function. The
source is the same in every run, and compiling it was the biggest single part of a direct
``agentcall call``'s start: 72 classes and some 20 functions, 50-70 ms of ``compile``. Python
itself keeps compiled modules in ``__pycache__``; this keeps compiled generated code the same
way, in the installation's private state directory: the code object ``compile(source, filename,
"exec")`` returns, marshalled, in a file named by the SHA-256 of the mode, the filename and the
source, under a directory named by the interpreter's bytecode magic. A file that cannot be read
or is not a code object for that filename is compiled again and rewritten.

Only a one-call process installs it (:func:`install`, before the classes are made); the cache
is used only when the state directory and the cache's directories are this user's alone (0700,
not symlinks: what is in them runs as this user, like a ``.pyc``).
"""

from __future__ import annotations

import builtins
import contextlib
import hashlib
import importlib.util
import marshal
import os
import sys

TYPE_CHECKING = False
if TYPE_CHECKING:
    from pathlib import Path
    from typing import Any

# Under the state directory; one directory per interpreter's bytecode within it.
CACHE_DIR = "cache"
CODE_DIR_PREFIX = "code-"
# A directory past this many entries is emptied: old versions' code is never read again.
MAX_ENTRIES = 4096
# The modules whose module-level ``compile`` the cache stands in for (a global of a module is
# found before the builtin of the same name).
COMPILING_MODULES = ("attr._make", "cattrs.gen")
_CODE = type(compile("", "", "exec"))


class CodeCache:
    """``compile`` for generated source, answered from files where it can be."""

    def __init__(self, directory: str) -> None:
        self.directory = directory
        self.hits = 0
        self.misses = 0

    def compile(self, source: Any, filename: Any, mode: str, *args: Any, **kwargs: Any) -> Any:
        if args or kwargs or type(source) is not str or type(filename) is not str:
            return builtins.compile(source, filename, mode, *args, **kwargs)
        stable = _stable(source, filename)
        key = hashlib.sha256(f"{mode}\0{filename}\0{stable}".encode()).hexdigest()
        path = os.path.join(self.directory, key)
        code = self._read(path, filename)
        if code is not None:
            self.hits += 1
            return code
        self.misses += 1
        code = builtins.compile(source, filename, mode)
        self._write(path, marshal.dumps(code))
        return code

    @staticmethod
    def _read(path: str, filename: str) -> Any:
        try:
            fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
        except OSError:
            return None
        try:
            with os.fdopen(fd, "rb") as f:
                # Files this user's own runs wrote, in a directory only this user may write.
                code = marshal.loads(f.read())  # noqa: S302
        except (OSError, ValueError, EOFError, TypeError):
            return None
        if type(code) is not _CODE or code.co_filename != filename:
            return None
        return code

    @staticmethod
    def _write(path: str, data: bytes) -> None:
        temporary = f"{path}.{os.getpid()}.tmp"
        try:
            flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
            fd = os.open(temporary, flags, 0o600)
            with os.fdopen(fd, "wb") as f:
                f.write(data)
            os.replace(temporary, path)
        except OSError:
            # A cache that cannot be written is only slower.
            with contextlib.suppress(OSError):
                os.unlink(temporary)


_ATTRS_METHODS = "<attrs generated methods "


def _stable(source: str, filename: str) -> str:
    """``source`` without what differs from run to run: attrs writes a class's ``__hash__``
    with a salt, ``hash()`` of a name, which string hashing makes different in every process.
    Code kept from another run keeps that run's salt: a constant per class all the same, which
    is all attrs asks of it (objects of one class in one process hash alike)."""
    if not filename.startswith(_ATTRS_METHODS):
        return source
    salt = str(hash("<attrs generated hash " + filename[len(_ATTRS_METHODS) :]))
    return source.replace(salt, "<salt>")


def _private_dir(path: str) -> bool:
    """A real directory (not a symlink) of this user alone: the state directory's own rule
    (:mod:`agentcall.filetrust`)."""
    from pathlib import Path

    from agentcall.filetrust import FileTrust, mode_problem

    try:
        st = os.lstat(path)
    except OSError:
        return False
    problem = mode_problem(
        Path(path),
        mode=st.st_mode,
        uid=st.st_uid,
        my_uid=os.getuid(),
        trust=FileTrust.PRIVATE,
        directory=True,
    )
    return problem is None


def cache_directory(state_dir: Path) -> str | None:
    """The cache's directory under ``state_dir`` (made if missing), or None where it would not
    be private."""
    state = os.fspath(state_dir)
    if not _private_dir(state):
        return None
    magic = importlib.util.MAGIC_NUMBER.hex()
    parent = os.path.join(state, CACHE_DIR)
    directory = os.path.join(parent, f"{CODE_DIR_PREFIX}{sys.implementation.cache_tag}-{magic}")
    for path in (parent, directory):
        try:
            os.mkdir(path, 0o700)
        except FileExistsError:
            pass
        except OSError:
            return None
        if not _private_dir(path):
            return None
    return directory


def install(state_dir: Path) -> CodeCache | None:
    """Answer attrs' and cattrs' compiles from the cache in ``state_dir`` for the rest of this
    process (None: no private place for it, nothing changed)."""
    directory = cache_directory(state_dir)
    if directory is None:
        return None
    try:
        names = os.listdir(directory)
    except OSError:
        return None
    if len(names) > MAX_ENTRIES:
        _delete_entries(directory, names)
    cache = CodeCache(directory)
    for module_name in COMPILING_MODULES:
        module = sys.modules.get(module_name)
        if module is None:
            module = importlib.import_module(module_name)
        setattr(module, "compile", cache.compile)  # noqa: B010 - a global of another module
    return cache


def _ours(name: str) -> bool:
    """An entry's name (SHA-256 hex) or that of its temporary (``<entry>.<pid>.tmp``)."""
    key = name.split(".", 1)[0]
    return len(key) == 64 and all(c in "0123456789abcdef" for c in key)


def _delete_entries(directory: str, names: list[str]) -> None:
    """Delete the entries (and temporaries) among ``names``; anything else stays."""
    for name in names:
        if _ours(name):
            with contextlib.suppress(OSError):
                os.unlink(os.path.join(directory, name))


def remove(state_dir: Path) -> Path | None:
    """Delete the cache under ``state_dir`` (``agentcall uninstall``): the entries this module
    wrote, then its directories once empty; never through a symlink. The cache directory when
    it is gone, else None (it was not there, or holds something else, which stays)."""
    parent = os.path.join(os.fspath(state_dir), CACHE_DIR)
    if not _private_dir(parent):
        return None
    for name in os.listdir(parent):
        directory = os.path.join(parent, name)
        if not name.startswith(CODE_DIR_PREFIX) or not _private_dir(directory):
            continue
        _delete_entries(directory, os.listdir(directory))
        with contextlib.suppress(OSError):
            os.rmdir(directory)
    try:
        os.rmdir(parent)
    except OSError:
        return None
    from pathlib import Path

    return Path(parent)


def restore_builtin_compile() -> None:
    """Let the modules of :data:`COMPILING_MODULES` use the builtin again (tests)."""
    for module_name in COMPILING_MODULES:
        module = sys.modules.get(module_name)
        if module is not None and "compile" in vars(module):
            delattr(module, "compile")
