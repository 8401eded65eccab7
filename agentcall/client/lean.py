"""Leaner imports for a short-lived process that dials the relay once (``agentcall call`` with no
service to hand the call to).

Twisted and autobahn import, at module level, things a WebSocket client never touches:

- ``twisted.python.compat`` binds ``http.cookiejar`` (``from http import cookiejar``), which
  brings ``urllib.request`` and ``http.client`` (about 25 ms);
- ``autobahn.websocket.protocol`` imports ``hyperlink`` (about 7 ms), which only a server
  answering a redirect uses;
- ``autobahn.twisted``'s package ``__init__`` imports the WAMP session layer (serializers,
  rawsocket, ``twisted.application``), which a plain WebSocket needs none of;
- ``autobahn.twisted.websocket`` imports ``twisted.internet.endpoints`` (for helpers we do not
  use), which imports Twisted's TLS layer and through it service-identity and cryptography's
  x509 (about 30 ms); a call to a relay named by its address dials without endpoints
  (:class:`agentcall.client.ws.AddressEndpoint`); the reactor imports ``twisted.internet.ssl``
  too, and looks at it only to listen or connect with TLS;
- pyOpenSSL's ``SSL`` module (which autobahn imports to recognise TLS errors) imports
  ``cryptography.x509`` (about 20 ms), used only once certificates are handled;
- ``autobahn.util`` imports click, when it is installed (the MCP server's dependencies bring
  it), only to colour autobahn's own debug lines (about 7 ms); it is imported here with click
  hidden (:data:`HIDDEN`), which autobahn reads as click not being installed: its lines stay
  plain text. Once it is imported, click is importable again for anything that wants it;
- ``twisted.internet.defer`` (and txaio) take four names from ``asyncio``, whose package
  ``__init__`` loads all of asyncio: event loops, streams, subprocesses, ``ssl``,
  ``concurrent.futures`` (about 15 ms). The package is put in place like the modules above,
  with the submodules that define those names loaded and their names set on it as its
  ``__init__`` would set them (:data:`PARTLY`); the rest runs when anything asks for more.

:func:`lean_imports` puts each in ``sys.modules`` as a module that is set up (spec, path: an
``import`` of it, or of a submodule, finds it ready) but whose code has not run; the first time
anything asks it for a name it does not have, its code runs, once, and the name is returned.
Nothing behaves differently; what is never used is never loaded. (``importlib.util.LazyLoader``
would not do: in this Python an ``import x`` of a module already in ``sys.modules`` reads its
``__spec__``, which makes a lazy module load.) It changes the process's module table, so only
a process that places one call runs it (the listener and the relay do not), before Twisted is
imported. :func:`without_collections` keeps the cyclic garbage collector out of the imports.
"""

from __future__ import annotations

import contextlib
import gc
import importlib.util
import sys
from collections.abc import Iterator

TYPE_CHECKING = False
if TYPE_CHECKING:  # the thin path of `agentcall call` loads this module and never typing
    from typing import Any

# Imported by Twisted or autobahn at module level; run only when something uses them.
DEFERRED = (
    "http.cookiejar",
    "hyperlink",
    "autobahn.twisted",
    "twisted.internet.endpoints",
    "twisted.internet.ssl",
    "cryptography.x509",
)

# Packages deferred with some submodules loaded beforehand: (package, the submodules in an order
# in which each finds the ones it imports already there, the ones whose ``__all__`` the package's
# ``__init__`` star-imports).
PARTLY = (
    (
        "asyncio",
        (
            "asyncio.constants",
            "asyncio.format_helpers",
            "asyncio.exceptions",
            "asyncio.base_futures",
            "asyncio.coroutines",
            "asyncio.events",
            "asyncio.base_tasks",
            "asyncio.futures",
        ),
        ("asyncio.coroutines", "asyncio.events", "asyncio.exceptions", "asyncio.futures"),
    ),
)


# Modules hidden while the module that treats them as optional is imported: (module, hidden).
HIDDEN = (("autobahn.util", ("click",)),)


def lean_imports() -> None:
    """Put each of :data:`DEFERRED` and :data:`PARTLY` not imported yet in place, its code not
    run yet; import each module of :data:`HIDDEN` without its optional helpers."""
    for name in DEFERRED:
        _deferred(name)
    for package, submodules, starred in PARTLY:
        if package in sys.modules or not _deferred(package):
            continue
        for name in submodules:
            importlib.import_module(name)
        for name in starred:
            module = sys.modules[name]
            for attribute in module.__all__:
                setattr(sys.modules[package], attribute, getattr(module, attribute))
    for name, optional in HIDDEN:
        if name not in sys.modules:
            _import_without(name, optional)


def _import_without(name: str, optional: tuple[str, ...]) -> None:
    """Import ``name`` as if the modules ``optional`` were not installed."""
    # None in sys.modules makes an import of that name fail with ImportError.
    hidden = [module for module in optional if module not in sys.modules]
    for module in hidden:
        sys.modules[module] = None  # type: ignore[assignment]
    try:
        importlib.import_module(name)
    finally:
        for module in hidden:
            if module in sys.modules and sys.modules[module] is None:
                del sys.modules[module]


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


def _deferred(name: str) -> bool:
    """Whether ``name`` was put in place (False: already imported, or not found)."""
    if name in sys.modules:
        return False
    spec = importlib.util.find_spec(name)
    if spec is None or spec.loader is None:
        return False
    loader = spec.loader
    module = importlib.util.module_from_spec(spec)
    ran: list[bool] = []

    def rest_of_module(attribute: str) -> Any:
        # Something wants a name the module's code defines: run it now, once.
        if ran:
            raise AttributeError(f"module {name!r} has no attribute {attribute!r}")
        ran.append(True)
        del module.__getattr__
        loader.exec_module(module)
        return getattr(module, attribute)

    module.__getattr__ = rest_of_module  # type: ignore[method-assign]
    sys.modules[name] = module
    parent, _, child = name.rpartition(".")
    if parent:
        setattr(sys.modules[parent], child, module)
    return True
