"""Leaner imports for a short-lived process that dials the relay once (``agentcall call`` with no
service to hand the call to).

Twisted and autobahn import, at module level, things a WebSocket client never touches:

- ``twisted.python.compat`` binds ``http.cookiejar`` (``from http import cookiejar``), which
  brings ``urllib.request`` and ``http.client`` (about 25 ms);
- ``autobahn.twisted``'s package ``__init__`` imports the WAMP session layer (serializers,
  rawsocket, ``twisted.application``), which a plain WebSocket needs none of.

:func:`lean_imports` makes the first lazy (:class:`importlib.util.LazyLoader`: the module is
loaded for real on first use of any of its attributes) and lets ``autobahn.twisted.websocket``
be imported without running the package's ``__init__`` until something asks the package for a
name of its own. (A module reached by a later ``import x`` statement cannot stay lazy: the
import system reads its ``__spec__``, which loads it; ``hyperlink``, imported that way by
autobahn, is therefore not listed.) Nothing behaves differently; what is never used is never
loaded. It changes the process's module table, so only a process that places one call runs it
(the listener and the relay do not), and it must run before Twisted is imported.
"""

from __future__ import annotations

import contextlib
import gc
import importlib.util
import sys
import types
from collections.abc import Iterator
from typing import Any

# Imported by Twisted or autobahn at module level, unused by a client socket.
LAZY = ("http.cookiejar",)
# Packages whose __init__ runs only when the package itself is asked for a name.
DEFERRED_INIT = ("autobahn.twisted",)


def lean_imports() -> None:
    """Make :data:`LAZY` lazy and :data:`DEFERRED_INIT` deferred, where not imported yet."""
    for name in LAZY:
        _lazy(name)
    for name in DEFERRED_INIT:
        _deferred_init(name)


@contextlib.contextmanager
def without_collections() -> Iterator[None]:
    """No cyclic garbage collection inside the block (imports: hundreds of modules, nearly
    no garbage), as before it afterwards."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


def _bind(name: str, module: types.ModuleType) -> None:
    sys.modules[name] = module
    parent, _, child = name.rpartition(".")
    if parent:
        setattr(sys.modules[parent], child, module)


def _lazy(name: str) -> None:
    if name in sys.modules:
        return
    spec = importlib.util.find_spec(name)
    if spec is None or spec.loader is None:
        return
    loader = importlib.util.LazyLoader(spec.loader)
    spec.loader = loader
    module = importlib.util.module_from_spec(spec)
    _bind(name, module)
    loader.exec_module(module)


def _deferred_init(name: str) -> None:
    if name in sys.modules:
        return
    spec = importlib.util.find_spec(name)
    if spec is None or spec.loader is None or spec.submodule_search_locations is None:
        return
    loader = spec.loader
    # The package with its path set (so its submodules import) but its __init__ not run.
    package = importlib.util.module_from_spec(spec)
    ran: list[bool] = []

    def rest_of_package(attribute: str) -> Any:
        # Something wants a name the package's __init__ defines: run it now, once.
        if ran:
            raise AttributeError(f"module {name!r} has no attribute {attribute!r}")
        ran.append(True)
        del package.__getattr__
        loader.exec_module(package)
        return getattr(package, attribute)

    package.__getattr__ = rest_of_package  # type: ignore[method-assign]
    _bind(name, package)
