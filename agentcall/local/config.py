"""config.json: who this installation is, which relay it uses, and how it runs its agent.

The file is written by ``agentcall setup`` and may be edited by hand, so loading it is strict
and fails closed: an unknown key, a missing key or a bad value stops every command with an error
naming the file and the field, instead of running with a guess.

``AGENTCALL_RELAY``, when set in the environment, replaces ``relay_url`` for this run only. A
config loaded that way cannot be saved, so a temporary override never ends up in the file;
commands that rewrite the file load it with ``apply_override=False``.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import math
import os
from collections.abc import Callable, Iterator
from typing import Any

import attrs

from agentcall import ids, limits
from agentcall.errors import MalformedFrame
from agentcall.local.home import Home, LocalStateError
from agentcall.relayurl import InvalidRelayUrl, RelayUrl
from agentcall.wire import codec
from agentcall.wire.roles import AgentKind, MemberRole

CONFIG_VERSION = 1
MAX_CONFIG_BYTES = 64 * 1024
MAX_ARGV_ITEMS = 64
MAX_READ_ROOTS = 64
MAX_PATH_CHARS = 4096
AGENT_TIMEOUT_RANGE = (1.0, limits.AGENT_TIMEOUT_S)
KILL_GRACE_RANGE = (0.1, limits.KILL_GRACE_S)


class NotSetUp(LocalStateError):
    """There is no config.json: this installation was never set up."""

    def __init__(self, home: Home) -> None:
        super().__init__(
            f"agentcall is not set up here ({home.config_path} is missing); "
            "run `agentcall setup --invite INVITE --handle HANDLE`"
        )


class ConfigError(LocalStateError):
    """config.json (or an override of it) is malformed; names the file and the field."""

    def __init__(self, problem: str, *, field: str | None = None, path: str | None = None) -> None:
        where = ": ".join(part for part in (path, field) if part)
        super().__init__(f"{where}: {problem}" if where else problem)
        self.problem = problem
        self.field = field
        self.path = path


# --- field validators (each raises ConfigError naming its field) -------------------------------


def _fail(attribute: attrs.Attribute[Any], problem: str) -> ConfigError:
    return ConfigError(problem, field=attribute.name)


def _is_str(value: object) -> bool:
    return type(value) is str


def _check_version(_inst: object, attribute: attrs.Attribute[Any], value: object) -> None:
    if type(value) is not int or value != CONFIG_VERSION:
        raise _fail(attribute, f"this agentcall understands version {CONFIG_VERSION} only")


def _check_relay_url(_inst: object, attribute: attrs.Attribute[Any], value: object) -> None:
    if not _is_str(value):
        raise _fail(attribute, "expected a string")
    try:
        RelayUrl.parse(str(value))
    except InvalidRelayUrl as exc:
        raise _fail(attribute, str(exc)) from None


def _matching(regex: Any, what: str) -> Callable[[object, attrs.Attribute[Any], object], None]:
    def check(_inst: object, attribute: attrs.Attribute[Any], value: object) -> None:
        if not _is_str(value) or regex.match(value) is None:
            raise _fail(attribute, f"not a valid {what}")

    return check


def _check_token(_inst: object, attribute: attrs.Attribute[Any], value: object) -> None:
    # The message never repeats the value: it is a secret even when it is malformed.
    if not _is_str(value) or ids.TOKEN_RE.match(str(value)) is None:
        raise _fail(attribute, "not a valid token (43 characters of base64url)")


def _check_enum(
    enum_type: type[Any], *, optional: bool
) -> Callable[[object, attrs.Attribute[Any], object], None]:
    def check(_inst: object, attribute: attrs.Attribute[Any], value: object) -> None:
        if value is None and optional:
            return
        if not isinstance(value, enum_type):
            choices = ", ".join(member.value for member in enum_type)
            raise _fail(attribute, f"must be one of: {choices}")

    return check


def _check_path(attribute: attrs.Attribute[Any], value: object) -> None:
    if not _is_str(value) or not value or len(str(value)) > MAX_PATH_CHARS:
        raise _fail(attribute, "expected a non-empty path")
    if "\0" in str(value) or not os.path.isabs(str(value)):
        raise _fail(attribute, f"must be an absolute path: {value!r}")


def _check_optional_path(_inst: object, attribute: attrs.Attribute[Any], value: object) -> None:
    if value is not None:
        _check_path(attribute, value)


def _check_read_roots(_inst: object, attribute: attrs.Attribute[Any], value: object) -> None:
    if type(value) is not tuple or len(value) > MAX_READ_ROOTS:
        raise _fail(attribute, f"expected a list of at most {MAX_READ_ROOTS} absolute paths")
    for root in value:
        _check_path(attribute, root)


def _check_argv(_inst: object, attribute: attrs.Attribute[Any], value: object) -> None:
    if value is None:
        return
    if type(value) is not tuple or not 1 <= len(value) <= MAX_ARGV_ITEMS:
        raise _fail(attribute, f"expected a list of 1..{MAX_ARGV_ITEMS} strings")
    for arg in value:
        # A NUL cannot be passed to exec; an empty program name would run nothing useful.
        if not _is_str(arg) or "\0" in arg or len(arg) > MAX_PATH_CHARS:
            raise _fail(attribute, "every argument must be a string without NUL")
    if not value[0]:
        raise _fail(attribute, "the program (first item) may not be empty")


def _in_range(lo: float, hi: float) -> Callable[[object, attrs.Attribute[Any], object], None]:
    def check(_inst: object, attribute: attrs.Attribute[Any], value: object) -> None:
        if type(value) is not float or not math.isfinite(value) or not lo <= value <= hi:
            raise _fail(attribute, f"must be a number of seconds in {lo:g}..{hi:g}")

    return check


def _seconds(value: object) -> object:
    # JSON writes 300.0 as 300; both spell the same duration. Booleans are not numbers here.
    if type(value) is int:
        return float(value)
    return value


def _tuple_of(value: object) -> object:
    return tuple(value) if type(value) is list else value


def _to_enum(enum_type: type[Any], value: object) -> object:
    if not _is_str(value) or isinstance(value, enum_type):
        return value
    try:
        return enum_type(value)
    except ValueError:
        return value  # the validator reports it, naming the field


def _to_role(value: object) -> object:
    return _to_enum(MemberRole, value)


def _to_agent_kind(value: object) -> object:
    return _to_enum(AgentKind, value)


@attrs.frozen(kw_only=True)
class Config:
    """The validated contents of config.json; the token never appears in its repr."""

    version: int = attrs.field(default=CONFIG_VERSION, validator=_check_version)
    relay_url: str = attrs.field(validator=_check_relay_url)
    # What the relay announced at registration; bound into every key record and envelope.
    relay_origin: str = attrs.field(validator=_matching(ids.RELAY_ORIGIN_RE, "relay origin"))
    org: str = attrs.field(validator=_matching(ids.ORG_RE, "organisation name"))
    handle: str = attrs.field(validator=_matching(ids.HANDLE_RE, "handle"))
    role: MemberRole = attrs.field(
        converter=_to_role,
        validator=_check_enum(MemberRole, optional=False),
    )
    token: str = attrs.field(repr=False, validator=_check_token)
    # None: a caller-only installation that never answers calls.
    agent_kind: AgentKind | None = attrs.field(
        default=None,
        converter=_to_agent_kind,
        validator=_check_enum(AgentKind, optional=True),
    )
    agent_command: tuple[str, ...] | None = attrs.field(
        default=None,
        converter=_tuple_of,
        validator=_check_argv,
    )
    ca_file: str | None = attrs.field(default=None, validator=_check_optional_path)
    read_roots: tuple[str, ...] = attrs.field(
        converter=_tuple_of,
        validator=_check_read_roots,
    )
    agent_timeout_s: float = attrs.field(
        default=limits.AGENT_TIMEOUT_S,
        converter=_seconds,
        validator=_in_range(*AGENT_TIMEOUT_RANGE),
    )
    kill_grace_s: float = attrs.field(
        default=limits.KILL_GRACE_S,
        converter=_seconds,
        validator=_in_range(*KILL_GRACE_RANGE),
    )
    # True when AGENTCALL_RELAY replaced relay_url at load time; never saved.
    relay_overridden: bool = attrs.field(default=False, eq=False)

    def __attrs_post_init__(self) -> None:
        is_command = self.agent_kind is AgentKind.COMMAND
        if is_command and self.agent_command is None:
            raise ConfigError("required when agent_kind is 'command'", field="agent_command")
        if not is_command and self.agent_command is not None:
            raise ConfigError("only allowed when agent_kind is 'command'", field="agent_command")

    @property
    def address(self) -> str:
        return ids.format_address(self.org, self.handle)

    @property
    def caller_only(self) -> bool:
        return self.agent_kind is None

    @property
    def relay(self) -> RelayUrl:
        return RelayUrl.parse(self.relay_url)


# The JSON keys, in the order they are written; the first group must be present.
_REQUIRED = ("version", "relay_url", "relay_origin", "org", "handle", "role", "token")
_OPTIONAL = (
    "agent_kind",
    "agent_command",
    "ca_file",
    "read_roots",
    "agent_timeout_s",
    "kill_grace_s",
)
_KNOWN = frozenset(_REQUIRED + _OPTIONAL)


def _to_json(config: Config) -> dict[str, Any]:
    body: dict[str, Any] = {
        "version": config.version,
        "relay_url": config.relay_url,
        "relay_origin": config.relay_origin,
        "org": config.org,
        "handle": config.handle,
        "role": config.role.value,
        "token": config.token,
        "agent_kind": None if config.agent_kind is None else config.agent_kind.value,
    }
    if config.agent_command is not None:
        body["agent_command"] = list(config.agent_command)
    if config.ca_file is not None:
        body["ca_file"] = config.ca_file
    body["read_roots"] = list(config.read_roots)
    body["agent_timeout_s"] = config.agent_timeout_s
    body["kill_grace_s"] = config.kill_grace_s
    return body


def _from_json(raw: object, home: Home) -> Config:
    if type(raw) is not dict:
        raise ConfigError("expected a JSON object")
    unknown = sorted(set(raw) - _KNOWN)
    if unknown:
        raise ConfigError("unknown field (a typo, or a newer agentcall's file?)", field=unknown[0])
    for name in _REQUIRED:
        if name not in raw:
            raise ConfigError("missing", field=name)
    fields = dict(raw)
    # Without read_roots the agent may read the user's home, as `setup` would have written.
    fields.setdefault("read_roots", [str(home.user_home)])
    # Types are checked by the field validators, each naming its field.
    return Config(**fields)


def load_config(home: Home, *, apply_override: bool = True) -> Config:
    """Read and validate config.json; with ``apply_override``, honour AGENTCALL_RELAY.

    :raises NotSetUp: there is no config.json.
    :raises ConfigError: it is malformed (the message names the file and the field).
    :raises PrivateFileError: it is not a private file of ours.
    """
    path = home.config_path
    try:
        data = home.read_private(path)
    except FileNotFoundError:
        raise NotSetUp(home) from None
    try:
        raw = codec.parse_json(data, max_bytes=MAX_CONFIG_BYTES)
    except MalformedFrame as exc:
        raise ConfigError(f"not valid JSON ({exc})", path=str(path)) from None
    try:
        config = _from_json(raw, home)
    except ConfigError as exc:
        raise ConfigError(exc.problem, field=exc.field, path=str(path)) from None
    if apply_override and home.relay_override is not None:
        try:
            config = attrs.evolve(config, relay_url=home.relay_override, relay_overridden=True)
        except ConfigError as exc:
            raise ConfigError(exc.problem, field="relay_url", path="AGENTCALL_RELAY") from None
    return config


def save_config(home: Home, config: Config) -> None:
    """Write config.json atomically, 0600 in the 0700 state directory."""
    if config.relay_overridden:
        raise ConfigError(
            "this config carries AGENTCALL_RELAY's URL; load it with apply_override=False "
            "before saving, so the override is not written to the file",
            field="relay_url",
            path=str(home.config_path),
        )
    text = json.dumps(_to_json(config), indent=2, ensure_ascii=False) + "\n"
    home.write_private(home.config_path, text.encode("utf-8"))


CONFIG_LOCK_NAME = "config.lock"


@contextlib.contextmanager
def config_lock(home: Home) -> Iterator[None]:
    """Hold while reading, changing and saving config.json, so two commands changing it at
    once (``config set`` and ``token rotate``) each see the other's change instead of one
    silently undoing it. Readers need no lock: the file is replaced atomically."""
    path = home.state_dir / CONFIG_LOCK_NAME
    home.create_private(path)
    fd = os.open(path, os.O_RDWR | os.O_NOFOLLOW)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)
