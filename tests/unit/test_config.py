"""config.json: round trip, strict validation naming file and field, NotSetUp, the override."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import attrs
import pytest

from agentcall import limits
from agentcall.local.config import Config, ConfigError, NotSetUp, load_config, save_config
from agentcall.local.home import Home, PrivateFileError
from agentcall.wire.http import AgentKind, MemberRole

TOKEN = "T" * 43


@pytest.fixture
def home(tmp_path: Path) -> Home:
    return Home.from_environ({"HOME": str(tmp_path)})


def minimal() -> dict[str, Any]:
    return {
        "version": 1,
        "relay_url": "https://relay.example",
        "relay_origin": "relay.example",
        "org": "acme",
        "handle": "ken",
        "role": "member",
        "token": TOKEN,
    }


def make_config(**changes: Any) -> Config:
    fields: dict[str, Any] = {
        "relay_url": "https://relay.example",
        "relay_origin": "relay.example",
        "org": "acme",
        "handle": "ken",
        "role": MemberRole.ADMIN,
        "token": TOKEN,
        "agent_kind": AgentKind.CLAUDE,
        "read_roots": ("/srv/code",),
    }
    fields.update(changes)
    return Config(**fields)


def write_raw(home: Home, body: object) -> None:
    home.write_private(home.config_path, json.dumps(body).encode())


def test_round_trip(home: Home) -> None:
    """What is saved loads back equal, with every field."""
    config = make_config(
        agent_kind=AgentKind.COMMAND,
        agent_command=("/usr/bin/my-agent", "--flag"),
        ca_file="/etc/ssl/private-ca.pem",
        agent_timeout_s=120.5,
        kill_grace_s=0.5,
    )
    save_config(home, config)
    assert load_config(home) == config
    assert os.stat(home.config_path).st_mode & 0o777 == 0o600


def test_minimal_file_gets_defaults(home: Home) -> None:
    """Optional fields default: caller-only, limits' timeouts, the user's home readable."""
    write_raw(home, minimal())
    config = load_config(home)
    assert config.caller_only
    assert config.agent_kind is None and config.agent_command is None and config.ca_file is None
    assert config.read_roots == (str(home.user_home),)
    assert config.agent_timeout_s == limits.AGENT_TIMEOUT_S
    assert config.kill_grace_s == limits.KILL_GRACE_S
    assert config.role is MemberRole.MEMBER
    assert config.address == "@acme/ken"
    assert str(config.relay) == "https://relay.example"


def test_whole_seconds_load_as_floats(home: Home) -> None:
    """JSON integers are accepted for durations and become floats."""
    write_raw(home, {**minimal(), "agent_timeout_s": 60, "kill_grace_s": 2})
    config = load_config(home)
    assert (config.agent_timeout_s, config.kill_grace_s) == (60.0, 2.0)
    assert type(config.agent_timeout_s) is float


def test_missing_file_is_not_set_up(home: Home) -> None:
    """No config.json means setup never ran; the message says how to run it."""
    with pytest.raises(NotSetUp, match=r"agentcall setup --invite INVITE --handle HANDLE"):
        load_config(home)


def test_loose_permissions_are_refused(home: Home) -> None:
    """A config.json others can read is refused (it holds the token)."""
    write_raw(home, minimal())
    os.chmod(home.config_path, 0o644)
    with pytest.raises(PrivateFileError, match="chmod 600"):
        load_config(home)


BAD_FIELDS: list[tuple[str, object]] = [
    ("version", 2),
    ("version", True),
    ("version", "1"),
    ("relay_url", "http://relay.example"),  # plain http off loopback
    ("relay_url", "ftp://relay.example"),
    ("relay_url", 5),
    ("relay_origin", "Relay Example"),
    ("org", "Acme"),
    ("org", "a"),
    ("handle", "-ken"),
    ("handle", None),
    ("role", "owner"),
    ("role", None),
    ("role", 1),
    ("token", "short"),
    ("token", 43),
    ("agent_kind", "gpt"),
    ("agent_kind", 1),
    ("agent_command", ["x"]),  # forbidden unless the kind is "command"
    ("ca_file", "relative/ca.pem"),
    ("ca_file", ""),
    ("ca_file", 7),
    ("read_roots", "/home/ken"),
    ("read_roots", ["relative"]),
    ("read_roots", [5]),
    ("read_roots", ["/ok", "/bad\u0000"]),
    ("agent_timeout_s", 0.5),
    ("agent_timeout_s", 301),
    ("agent_timeout_s", True),
    ("agent_timeout_s", "60"),
    ("kill_grace_s", 0.05),
    ("kill_grace_s", 11),
]


@pytest.mark.parametrize(("field", "value"), BAD_FIELDS)
def test_bad_values_name_file_and_field(home: Home, field: str, value: object) -> None:
    """Each bad value fails closed with an error naming config.json and the field."""
    write_raw(home, {**minimal(), field: value})
    with pytest.raises(ConfigError) as info:
        load_config(home)
    assert info.value.field == field
    assert str(info.value).startswith(f"{home.config_path}: {field}: ")


@pytest.mark.parametrize(
    "command", [None, [], [""], ["ok", 5], ["a\u0000b"], "run-agent", ["x"] * 65]
)
def test_command_kind_needs_a_valid_argv(home: Home, command: object) -> None:
    """The command kind requires a non-empty argv of strings."""
    body = {**minimal(), "agent_kind": "command"}
    if command is not None:
        body["agent_command"] = command
    write_raw(home, body)
    with pytest.raises(ConfigError) as info:
        load_config(home)
    assert info.value.field == "agent_command"
    assert str(home.config_path) in str(info.value)


@pytest.mark.parametrize("field", ["version", "relay_url", "org", "handle", "role", "token"])
def test_missing_required_field_is_named(home: Home, field: str) -> None:
    """A required key that is absent is reported by name."""
    body = minimal()
    del body[field]
    write_raw(home, body)
    with pytest.raises(ConfigError, match=rf"config\.json: {field}: missing"):
        load_config(home)


def test_unknown_key_is_refused(home: Home) -> None:
    """A typo'd key is an error, not silently ignored."""
    write_raw(home, {**minimal(), "agent_timout_s": 10})
    with pytest.raises(ConfigError, match=r"config\.json: agent_timout_s: unknown field"):
        load_config(home)


def test_load_time_flag_is_not_a_file_key(home: Home) -> None:
    """relay_overridden can only come from the environment, never from the file."""
    write_raw(home, {**minimal(), "relay_overridden": True})
    with pytest.raises(ConfigError, match="relay_overridden: unknown field"):
        load_config(home)


@pytest.mark.parametrize(
    "data", [b"", b"not json", b"[]", b'"x"', b'{"version": 1, "version": 1}', b"\xff"]
)
def test_malformed_json_names_the_file(home: Home, data: bytes) -> None:
    """Broken JSON, a non-object or duplicate keys fail closed, naming the file."""
    home.write_private(home.config_path, data)
    with pytest.raises(ConfigError, match=str(home.config_path)):
        load_config(home)


def test_errors_never_show_the_token(home: Home) -> None:
    """A bad token is reported without repeating it."""
    secret = "s3cret-but-the-wrong-length"
    write_raw(home, {**minimal(), "token": secret})
    with pytest.raises(ConfigError) as info:
        load_config(home)
    assert secret not in str(info.value)


def test_repr_hides_the_token() -> None:
    """Logging a config never logs its token."""
    config = make_config()
    assert TOKEN not in repr(config)
    assert TOKEN not in str(config)
    assert "handle='ken'" in repr(config)


def test_relay_override_applies_on_load(tmp_path: Path) -> None:
    """AGENTCALL_RELAY replaces relay_url for this run only."""
    environ = {"HOME": str(tmp_path), "AGENTCALL_RELAY": "http://127.0.0.1:9000"}
    home = Home.from_environ(environ)
    save_config(home, make_config())
    config = load_config(home)
    assert config.relay_url == "http://127.0.0.1:9000"
    assert config.relay_overridden
    plain = load_config(home, apply_override=False)
    assert plain.relay_url == "https://relay.example"
    assert not plain.relay_overridden


def test_overridden_config_cannot_be_saved(tmp_path: Path) -> None:
    """A temporary override is never written into config.json."""
    home = Home.from_environ({"HOME": str(tmp_path), "AGENTCALL_RELAY": "https://other.example"})
    save_config(home, make_config())
    overridden = load_config(home)
    with pytest.raises(ConfigError, match="relay_url"):
        save_config(home, attrs.evolve(overridden, handle="bob"))
    assert load_config(home, apply_override=False).relay_url == "https://relay.example"


def test_bad_override_names_the_variable(tmp_path: Path) -> None:
    """An invalid AGENTCALL_RELAY is reported as such, not as a config.json problem."""
    home = Home.from_environ({"HOME": str(tmp_path), "AGENTCALL_RELAY": "http://evil.example"})
    save_config(home, make_config())
    with pytest.raises(ConfigError, match=r"^AGENTCALL_RELAY: relay_url: refusing plain http"):
        load_config(home)


def test_constructing_a_bad_config_in_code_fails_too() -> None:
    """The same validators guard configs built by setup, naming the field."""
    with pytest.raises(ConfigError) as info:
        make_config(kill_grace_s=60.0)
    assert info.value.field == "kill_grace_s"
    with pytest.raises(ConfigError, match="agent_command: required"):
        make_config(agent_kind=AgentKind.COMMAND)
