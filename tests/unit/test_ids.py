"""Identifier grammar: addresses, regexes and minted ids."""

from __future__ import annotations

import re
import secrets
import uuid
from collections.abc import Callable

import pytest
from hypothesis import given, settings

from agentcall import ids
from agentcall.ids import Address, AddressError
from tests.hypothesis_profiles import examples
from tests.unit import wire_strategies as ws


@settings(max_examples=examples(200))
@given(org=ws.orgs, handle=ws.handles)
def test_address_round_trip(org: str, handle: str) -> None:
    """Formatting then parsing any valid org and handle gives the same address back."""
    text = ids.format_address(org, handle)
    assert text == f"@{org}/{handle}"
    address = ids.parse_address(text)
    assert address == Address(org, handle)
    assert str(address) == text


@pytest.mark.parametrize(
    ("text", "org", "handle"),
    [
        ("@ab/cd", "ab", "cd"),
        ("@" + "o" * 20 + "/" + "h" * 31, "o" * 20, "h" * 31),
        ("@0-/9a", "0-", "9a"),
        ("@a--b/c-d-e", "a--b", "c-d-e"),
        ("@acme/" + "h-" * 15 + "h", "acme", "h-" * 15 + "h"),
    ],
)
def test_address_edges_accepted(text: str, org: str, handle: str) -> None:
    """Shortest and longest names, digits first, and single hyphens between a handle's words
    are fine; an organisation named under the older rule (``0-``, ``a--b``) still parses."""
    assert ids.parse_address(text) == Address(org, handle)


REJECTED_ADDRESSES = {
    "uppercase org": "@Acme/ken",
    "uppercase handle": "@acme/Ken",
    "org too short": "@a/ken",
    "handle too short": "@acme/k",
    "org too long": "@" + "o" * 21 + "/ken",
    "handle too long": "@acme/" + "h" * 32,
    "org leading hyphen": "@-acme/ken",
    "handle leading hyphen": "@acme/-ken",
    "handle trailing hyphen": "@acme/bob-",
    "handle doubled hyphen": "@acme/bo--b",
    "handle only hyphens": "@acme/--",
    "handle tripled hyphen": "@acme/a---b",
    "host-like": "ken@acme.com",
    "host-like org": "@acme.com/ken",
    "missing @": "acme/ken",
    "double @": "@@acme/ken",
    "extra slash": "@acme/ken/x",
    "empty handle segment": "@acme//ken",
    "no handle": "@acme",
    "empty handle": "@acme/",
    "empty org": "@/ken",
    "empty": "",
    "underscore": "@acme/ken_x",
    "dot in handle": "@acme/ken.x",
    "trailing newline": "@acme/ken\n",
    "leading space": " @acme/ken",
    "trailing space": "@acme/ken ",
    "non-ascii letter": "@acme/kén",
    "fullwidth at sign": "\uff20acme/ken",
    "url": "https://acme/ken",
}


@pytest.mark.parametrize("text", REJECTED_ADDRESSES.values(), ids=REJECTED_ADDRESSES.keys())
def test_rejected_addresses(text: str) -> None:
    """Anything that is not exactly @org/handle is an AddressError (a ValueError)."""
    with pytest.raises(AddressError):
        ids.parse_address(text)
    assert ids.ADDRESS_RE.match(text) is None


@pytest.mark.parametrize(
    ("org", "handle"),
    [
        ("Acme", "ken"),
        ("acme", "k"),
        ("acme", "ken\n"),
        ("a", "ken"),
        ("acme.com", "ken"),
        ("acme", "bob-"),
        ("acme", "bo--b"),
    ],
)
def test_address_object_validates_its_parts(org: str, handle: str) -> None:
    """Address and format_address refuse invalid parts, not only parse_address."""
    with pytest.raises(AddressError):
        Address(org, handle)
    with pytest.raises(AddressError):
        ids.format_address(org, handle)


def test_address_error_is_a_value_error() -> None:
    """Callers may catch ValueError."""
    assert issubclass(AddressError, ValueError)


def test_name_predicates() -> None:
    """is_handle, is_org and is_task_id apply their regexes, boundaries included."""
    assert ids.is_handle("ab") and ids.is_handle("h" * 31)
    assert not ids.is_handle("a") and not ids.is_handle("h" * 32)
    assert not ids.is_handle("bob-") and not ids.is_handle("bo--b") and ids.is_handle("bo-b")
    assert ids.is_org("ab") and ids.is_org("o" * 20)
    assert not ids.is_org("a") and not ids.is_org("o" * 21)
    assert ids.is_task_id("a") and ids.is_task_id("t" * 64)
    assert not ids.is_task_id("") and not ids.is_task_id("t" * 65)
    assert not ids.is_task_id("-review") and not ids.is_task_id("Review")


# A valid example for every regex, to show each one anchors at both ends.
VALID_SAMPLES: dict[str, str] = {
    "ORG_RE": "acme",
    "NEW_ORG_RE": "acme-labs",
    "HANDLE_RE": "ken",
    "TASK_RE": "review",
    "ADDRESS_RE": "@acme/ken",
    "HEX32_RE": "ab" * 16,
    "HEX64_RE": "ab" * 32,
    "CORRELATION_ID_RE": "ab" * 16,
    "CONTEXT_ID_RE": "ctx_" + "A-_z" * 5 + "09",
    "CALL_ID_RE": "0b7e3f1e-2c4d-4a5b-9c6d-7e8f90a1b2c3",
    "JOB_ID_RE": "0b7e3f1e-2c4d-4a5b-9c6d-7e8f90a1b2c3",
    "FINGERPRINT_RE": "SHA256:" + "0f" * 16,
    "ROSTER_ID_RE": "R" * 16,
    "RELAY_ORIGIN_RE": "relay.example.com:8443",
    "CONTACT_NAME_RE": "bob.smith",
    "TOKEN_RE": "T" * 43,
}


def test_every_regex_has_a_sample() -> None:
    """A regex added to ids without a sample here would escape the anchoring test."""
    regexes = {name for name in vars(ids) if name.endswith("_RE")}
    assert regexes == set(VALID_SAMPLES)


@pytest.mark.parametrize(("name", "sample"), VALID_SAMPLES.items(), ids=VALID_SAMPLES.keys())
def test_regexes_match_whole_strings_only(name: str, sample: str) -> None:
    """Each regex takes its sample but not with a trailing newline, prefix or suffix."""
    regex: re.Pattern[str] = getattr(ids, name)
    assert regex.match(sample) is not None
    for variant in (sample + "\n", "\n" + sample, sample + "\r\n", " " + sample, sample + " "):
        assert regex.match(variant) is None, repr(variant)


@pytest.mark.parametrize(
    "value",
    [
        "0" * 32,
        "AB" * 16,
        "ab" * 15 + "a",
        "ab" * 16 + "a",
        "gh" * 16,
    ],
)
def test_invalid_correlation_ids(value: str) -> None:
    """All zeros, uppercase, wrong length and non-hex are not correlation ids."""
    assert ids.CORRELATION_ID_RE.match(value) is None


def test_correlation_id_may_contain_zeros() -> None:
    """Only the all-zero value is excluded."""
    assert ids.CORRELATION_ID_RE.match("0" * 31 + "1") is not None
    assert ids.HEX32_RE.match("0" * 32) is not None


@pytest.mark.parametrize(
    "value",
    [
        "00000000-0000-0000-0000-000000000000",
        "0B7E3F1E-2C4D-4A5B-9C6D-7E8F90A1B2C3",
        "0b7e3f1e-2c4d-1a5b-9c6d-7e8f90a1b2c3",
        "0b7e3f1e-2c4d-4a5b-7c6d-7e8f90a1b2c3",
        "0b7e3f1e2c4d4a5b9c6d7e8f90a1b2c3",
        "{0b7e3f1e-2c4d-4a5b-9c6d-7e8f90a1b2c3}",
    ],
)
def test_invalid_call_ids(value: str) -> None:
    """The nil UUID, uppercase, other versions or variants, and other spellings are refused."""
    assert ids.CALL_ID_RE.match(value) is None


@pytest.mark.parametrize(
    "value",
    ["Relay.example.com", "relay.example.com:", "relay.example.com:123456", "relay/x", ""],
)
def test_invalid_relay_origins(value: str) -> None:
    """A relay origin is a lowercase host with an optional port of at most 5 digits."""
    assert ids.RELAY_ORIGIN_RE.match(value) is None


MINTS: dict[str, tuple[Callable[[], str], re.Pattern[str]]] = {
    "hex32": (ids.mint_hex32, ids.HEX32_RE),
    "request_id": (ids.mint_request_id, ids.HEX32_RE),
    "correlation_id": (ids.mint_correlation_id, ids.CORRELATION_ID_RE),
    "call_id": (ids.mint_call_id, ids.CALL_ID_RE),
    "job_id": (ids.mint_job_id, ids.JOB_ID_RE),
    "token": (ids.mint_token, ids.TOKEN_RE),
    "context_id": (ids.mint_context_id, ids.CONTEXT_ID_RE),
}


@pytest.mark.parametrize(("mint", "regex"), MINTS.values(), ids=MINTS.keys())
def test_minted_ids_match_their_regex_and_differ(
    mint: Callable[[], str], regex: re.Pattern[str]
) -> None:
    """Every mint function yields values its own regex accepts, fresh each time."""
    values = [mint() for _ in range(64)]
    assert all(regex.match(value) for value in values), values
    assert len(set(values)) == len(values)


def test_minted_call_id_is_a_uuid4() -> None:
    """Call ids are canonical lowercase version-4 UUIDs."""
    value = ids.mint_call_id()
    assert str(uuid.UUID(value)) == value
    assert uuid.UUID(value).version == 4


def test_correlation_id_never_all_zeros(monkeypatch: pytest.MonkeyPatch) -> None:
    """When the random source yields all zeros, minting draws again."""
    draws = iter(["0" * 32, "0" * 32, "12" * 16])
    calls: list[int] = []

    def token_hex(nbytes: int) -> str:
        calls.append(nbytes)
        return next(draws)

    monkeypatch.setattr(secrets, "token_hex", token_hex)
    assert ids.mint_correlation_id() == "12" * 16
    assert calls == [16, 16, 16]


@pytest.mark.parametrize(
    ("name", "fresh"),
    [
        ("acme", True),
        ("acme-labs", True),
        ("o" * 20, True),
        ("acme-", False),
        ("ac--me", False),
        ("-acme", False),
        ("a", False),
        ("o" * 21, False),
    ],
)
def test_a_new_organisation_follows_the_handle_rule(name: str, fresh: bool) -> None:
    """Bootstrap refuses hyphens at either end or doubled; older names still parse."""
    assert ids.is_new_org_name(name) is fresh
    if name.endswith("-") or "--" in name:
        assert ids.is_org(name)
