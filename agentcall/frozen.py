"""Immutable value objects without attrs, for the modules the thin ``agentcall call`` imports.

Importing attrs costs that process more than a bare interpreter start (tens of milliseconds
on a slow machine), and the thin path, which hands the call to the running service, has to
finish in not much more than that. The few values it builds (its paths, the local socket's
lines, a peer's credentials) derive from :class:`Frozen` instead: a subclass lists its
fields in ``_fields`` (also its ``__slots__``), assigns them once with :meth:`Frozen._set`
in its own typed ``__init__``, and gets equality, hashing and a repr over those fields, and
an error on any later assignment, as ``attrs.frozen`` gives.
"""

from __future__ import annotations

# typing is imported for the type checker only: the thin `agentcall call` imports this module,
# and typing costs that process milliseconds (tests/unit/test_cli_call_thin.py).
TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any, ClassVar


class FrozenError(AttributeError):
    """An attempt to change a :class:`Frozen` value after it was made."""


class Frozen:
    """Base of immutable value classes; see the module docstring."""

    __slots__ = ()
    _fields: ClassVar[tuple[str, ...]] = ()

    def _set(self, **values: Any) -> None:
        """Assign the fields (only from ``__init__``)."""
        for name, value in values.items():
            object.__setattr__(self, name, value)

    def _values(self) -> tuple[Any, ...]:
        return tuple(getattr(self, name) for name in self._fields)

    def __setattr__(self, name: str, value: object) -> None:
        raise FrozenError(f"{type(self).__name__} is immutable: cannot set {name}")

    def __delattr__(self, name: str) -> None:
        raise FrozenError(f"{type(self).__name__} is immutable: cannot delete {name}")

    def __eq__(self, other: object) -> bool:
        if type(other) is not type(self) or not isinstance(other, Frozen):
            return NotImplemented
        return self._values() == other._values()

    def __hash__(self) -> int:
        return hash((type(self).__qualname__, self._values()))

    def __repr__(self) -> str:
        inner = ", ".join(f"{name}={getattr(self, name)!r}" for name in self._fields)
        return f"{type(self).__name__}({inner})"
