"""agentcall.frozen: the attrs-free immutable values of the thin CLI path."""

from __future__ import annotations

from pathlib import Path

import pytest

from agentcall.frozen import Frozen, FrozenError
from agentcall.ids import Address
from agentcall.local.home import Home
from agentcall.local.unixsocket import PeerCredentials


class Pair(Frozen):
    _fields = ("left", "right")
    __slots__ = _fields
    left: int
    right: str

    def __init__(self, left: int, right: str = "r") -> None:
        self._set(left=left, right=right)


class OtherPair(Frozen):
    _fields = ("left", "right")
    __slots__ = _fields

    def __init__(self, left: int, right: str) -> None:
        self._set(left=left, right=right)


def test_equal_by_value_and_type() -> None:
    assert Pair(1, "a") == Pair(1, "a")
    assert Pair(1, "a") != Pair(1, "b")
    assert Pair(1, "a") != OtherPair(1, "a")  # same fields, another class
    assert hash(Pair(1, "a")) == hash(Pair(1, "a"))
    assert len({Pair(1, "a"), Pair(1, "a"), Pair(2, "a")}) == 2


def test_repr_names_every_field_in_order() -> None:
    assert repr(Pair(1, "a")) == "Pair(left=1, right='a')"


def test_nothing_changes_after_init() -> None:
    value = Pair(1)
    with pytest.raises(FrozenError):
        value.left = 2
    with pytest.raises(FrozenError):
        del value.right
    with pytest.raises(AttributeError):
        value.extra = 3
    assert value == Pair(1, "r")


@pytest.mark.parametrize(
    "value",
    [
        Address("acme", "ken"),
        Home(Path("/h/.agentcall"), Path("/h")),
        PeerCredentials(1, 2, 3),
    ],
)
def test_the_thin_paths_values_are_frozen(value: Frozen) -> None:
    with pytest.raises(AttributeError):
        setattr(value, value._fields[0], None)
    assert value == type(value)(*value._values())


def test_home_keeps_its_keyword_form() -> None:
    home = Home(state_dir=Path("/h/.agentcall"), user_home=Path("/h"), relay_override="x")
    assert home.relay_override == "x"
    assert Home(Path("/h/.agentcall"), Path("/h")).relay_override is None
