"""Canonical encoding: known answers from the spec, round trips, injectivity and refusals."""

from __future__ import annotations

import hashlib

import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from agentcall.wire import canonical
from agentcall.wire.canonical import CanonicalError, Item
from tests.hypothesis_profiles import examples

I64_MIN = -(2**63)
I64_MAX = 2**63 - 1

items = st.one_of(st.none(), st.integers(I64_MIN, I64_MAX), st.text())
item_lists = st.lists(items, max_size=8)
# A tiny alphabet and range make distinct lists that share pieces (and tag bytes) common.
tricky_items = st.one_of(
    st.none(), st.integers(-2, 3), st.text(alphabet="ab\x00\x01\x02\x03", max_size=3)
)
tricky_lists = st.lists(tricky_items, max_size=4)


def _str(data: bytes) -> bytes:
    """A string item written out by hand: tag 0x01, u32 big-endian length, bytes."""
    return b"\x01" + len(data).to_bytes(4, "big") + data


# Vectors written from the docstring's rules, byte by byte.
KNOWN_ANSWERS: list[tuple[list[Item], bytes]] = [
    ([], b""),
    ([None], b"\x03"),
    ([""], b"\x01\x00\x00\x00\x00"),
    (["a"], b"\x01\x00\x00\x00\x01a"),
    (["é"], b"\x01\x00\x00\x00\x02\xc3\xa9"),
    (["\U0001f600"], b"\x01\x00\x00\x00\x04\xf0\x9f\x98\x80"),
    (["x" * 256], b"\x01\x00\x00\x01\x00" + b"x" * 256),
    ([0], b"\x02\x00\x00\x00\x00\x00\x00\x00\x00"),
    ([1], b"\x02\x00\x00\x00\x00\x00\x00\x00\x01"),
    ([256], b"\x02\x00\x00\x00\x00\x00\x00\x01\x00"),
    ([-1], b"\x02\xff\xff\xff\xff\xff\xff\xff\xff"),
    ([-256], b"\x02\xff\xff\xff\xff\xff\xff\xff\x00"),
    ([I64_MAX], b"\x02\x7f\xff\xff\xff\xff\xff\xff\xff"),
    ([I64_MIN], b"\x02\x80\x00\x00\x00\x00\x00\x00\x00"),
    (
        ["agentcall/test/v1", 1, None, "ab"],
        b"\x01\x00\x00\x00\x11agentcall/test/v1"
        b"\x02\x00\x00\x00\x00\x00\x00\x00\x01"
        b"\x03"
        b"\x01\x00\x00\x00\x02ab",
    ),
]


@pytest.mark.parametrize(("value", "expected"), KNOWN_ANSWERS, ids=repr)
def test_known_answer(value: list[Item], expected: bytes) -> None:
    """encode produces exactly the bytes the spec describes, and decode reads them back."""
    assert canonical.encode(value) == expected
    assert canonical.decode(expected) == value


def test_string_length_counts_utf8_bytes_not_characters() -> None:
    """The u32 prefix is the UTF-8 byte length: three characters, nine bytes."""
    assert canonical.encode(["日本語"]) == _str("日本語".encode())
    assert canonical.encode(["日本語"])[1:5] == (9).to_bytes(4, "big")


def test_digest_is_sha256_of_the_encoding() -> None:
    """digest and hexdigest hash the canonical bytes; the empty list hashes the empty string."""
    empty_sha256 = "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"
    assert canonical.digest([]) == bytes.fromhex(empty_sha256)
    assert canonical.hexdigest([]) == empty_sha256
    value: list[Item] = ["agentcall/test/v1", 1, None, "ab"]
    expected = hashlib.sha256(KNOWN_ANSWERS[-1][1]).digest()
    assert canonical.digest(value) == expected
    assert canonical.hexdigest(value) == expected.hex()


@settings(max_examples=examples(200))
@given(value=item_lists)
def test_round_trip(value: list[Item]) -> None:
    """decode(encode(x)) == x for any list of strings, i64 integers and nulls."""
    assert canonical.decode(canonical.encode(value)) == value


@settings(max_examples=examples(200))
@given(first=item_lists, second=item_lists)
def test_encoding_is_concatenation(first: list[Item], second: list[Item]) -> None:
    """Each item encodes on its own: the encoding of a list is the join of its items'."""
    joined = canonical.encode(first) + canonical.encode(second)
    assert canonical.encode(first + second) == joined


@settings(max_examples=examples(300))
@given(first=tricky_lists, second=tricky_lists)
def test_injective(first: list[Item], second: list[Item]) -> None:
    """Distinct item lists never encode to the same bytes."""
    assume(first != second)
    assert canonical.encode(first) != canonical.encode(second)


@pytest.mark.parametrize(
    ("first", "second"),
    [
        (["ab", "c"], ["a", "bc"]),
        ([""], []),
        (["", ""], [""]),
        ([None], ["\x03"]),
        ([0], [None]),
        ([0], ["\x00" * 8]),
        (["1"], [1]),
        ([None, None], [None]),
    ],
    ids=repr,
)
def test_classic_ambiguities_are_distinct(first: list[Item], second: list[Item]) -> None:
    """Splits, empties and look-alike values that naive joins would confuse stay distinct."""
    assert canonical.encode(first) != canonical.encode(second)


@settings(max_examples=examples(300))
@given(data=st.binary(max_size=40) | tricky_lists.map(canonical.encode).map(lambda b: b[:-1]))
def test_decode_accepts_only_canonical_bytes(data: bytes) -> None:
    """Any bytes fail with CanonicalError or are exactly the encoding of what they decode to."""
    try:
        decoded = canonical.decode(data)
    except CanonicalError:
        return
    assert canonical.encode(decoded) == data


@pytest.mark.parametrize(
    "value",
    [
        [True],
        [False],
        ["ok", 1, True],
        [I64_MAX + 1],
        [I64_MIN - 1],
        [2**64],
        ["\ud800"],
        ["a\udfffb"],
        ["\udc00\ud800"],
        [1.0],
        [b"bytes"],
        [["nested"]],
        [{"a": 1}],
    ],
    ids=repr,
)
def test_refused_values(value: list[object]) -> None:
    """Bools, out-of-range integers, lone surrogates and non-item types are refused."""
    with pytest.raises(CanonicalError):
        canonical.encode(value)  # type: ignore[arg-type]


def test_i64_bounds_are_accepted() -> None:
    """Both ends of the i64 range encode and decode."""
    assert canonical.decode(canonical.encode([I64_MIN, I64_MAX])) == [I64_MIN, I64_MAX]


@pytest.mark.parametrize(
    "data",
    [
        b"\x00",
        b"\x04",
        b"\xff",
        b"\x02",
        b"\x02\x00\x00\x00\x00\x00\x00\x00",
        b"\x01",
        b"\x01\x00\x00\x00",
        b"\x01\x00\x00\x00\x05abcd",
        b"\x01\x00\x00\x00\x01\xff",
        b"\x01\x00\x00\x00\x03\xed\xa0\x80",
        b"\x01\x00\x00\x00\x02\xc0\xaf",
        b"\x03\x05",
    ],
    ids=repr,
)
def test_decode_refuses_malformed_bytes(data: bytes) -> None:
    """Unknown tags, truncation and invalid or surrogate UTF-8 are CanonicalError."""
    with pytest.raises(CanonicalError):
        canonical.decode(data)


def test_canonical_error_is_a_value_error() -> None:
    """Callers may catch ValueError; CanonicalError is one."""
    assert issubclass(CanonicalError, ValueError)
