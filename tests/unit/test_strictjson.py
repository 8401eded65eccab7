"""One strict JSON reader: duplicate keys and NaN/Infinity refused, on the wire and in files."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from agentcall import strictjson
from agentcall.errors import MalformedFrame
from agentcall.listener.policy import PolicyError, load_policy
from agentcall.listener.policyfile import SchemaProblem, decode_json
from agentcall.wire import codec

NON_FINITE = ["NaN", "Infinity", "-Infinity"]


def test_plain_json_reads_as_json() -> None:
    assert strictjson.loads('{"a": [1, 2.5, "x", null, true]}') == {"a": [1, 2.5, "x", None, True]}


def test_a_duplicate_key_is_refused_and_named() -> None:
    with pytest.raises(strictjson.DuplicateKey) as caught:
        strictjson.loads('{"a": 1, "b": {"c": 1, "c": 2}}')
    assert caught.value.key == "c"


_JSON = st.recursive(
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(), inner, max_size=4),
    max_leaves=20,
)


@given(_JSON)
def test_whatever_json_holds_reads_as_python_reads_it(value: object) -> None:
    text = json.dumps(value)
    assert strictjson.loads(text) == json.loads(text)


@given(st.lists(st.sampled_from("abc"), min_size=1, max_size=6))
def test_the_first_key_seen_twice_is_the_one_named(keys: list[str]) -> None:
    text = "{" + ",".join(f'"{key}": {n}' for n, key in enumerate(keys)) + "}"
    repeated = next((k for i, k in enumerate(keys) if k in keys[:i]), None)
    if repeated is None:
        assert strictjson.loads(text) == {k: n for n, k in enumerate(keys)}
        return
    with pytest.raises(strictjson.DuplicateKey) as caught:
        strictjson.loads(text)
    assert caught.value.key == repeated


@pytest.mark.parametrize("constant", NON_FINITE)
def test_non_finite_numbers_are_refused(constant: str) -> None:
    with pytest.raises(strictjson.NotJsonConstant) as caught:
        strictjson.loads(f'{{"version": {constant}}}')
    assert caught.value.name == constant


@pytest.mark.parametrize("literal", ["1e999", "-1e400", "123e456789"])
def test_numbers_that_read_as_infinities_are_refused(literal: str) -> None:
    """Past the float range a literal reads as an infinity; it is refused like Infinity."""
    with pytest.raises(strictjson.NotJsonConstant) as caught:
        strictjson.loads(f'{{"n": {literal}}}')
    assert caught.value.name == literal
    assert strictjson.loads('{"n": 1.5e300}') == {"n": 1.5e300}


@pytest.mark.parametrize("text", ['{"a": 1, "a": 2}', '{"a": NaN}', '{"a": 1e999}'])
def test_the_wire_decoder_still_refuses_both(text: str) -> None:
    with pytest.raises(MalformedFrame, match="not valid JSON"):
        codec.parse_json(text.encode(), max_bytes=1000)


def test_owner_files_keep_their_duplicate_key_message() -> None:
    with pytest.raises(SchemaProblem, match=r"^duplicate key 'version'$"):
        decode_json(b'{"version": 2, "version": 1}')


@pytest.mark.parametrize("constant", NON_FINITE)
def test_owner_files_refuse_non_finite_numbers(constant: str) -> None:
    with pytest.raises(SchemaProblem, match=f"is not valid JSON \\({constant} is not a JSON"):
        decode_json(f'{{"version": {constant}}}'.encode())


@pytest.mark.parametrize("constant", NON_FINITE)
def test_a_policy_with_nan_is_refused_and_names_the_file(tmp_path: Path, constant: str) -> None:
    """policy.json accepted NaN before this reader; a policy it cannot read is never used."""
    path = tmp_path / "policy.json"
    path.write_text(f'{{"version": 2, "callers": {{"bob": {{"access": {constant}}}}}}}')
    path.chmod(0o600)
    with pytest.raises(PolicyError, match=f"policy.json: is not valid JSON \\({constant}"):
        load_policy(path)
