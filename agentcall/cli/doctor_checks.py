"""The checks behind ``agentcall doctor``. Each returns :class:`Check` values; nothing prints.

Everything that reaches outside the process (the relay, ``systemctl``, the agent CLI, PATH)
goes through :class:`DoctorDeps`, so tests pass fakes. The tool guard is the exception on
purpose: it is run for real, exactly as the listener wires it, because a guard that only
looks wired is the failure this check exists to catch.

Imports of Twisted and crypto stay inside functions: this module is loaded for ``--help``.
"""

from __future__ import annotations

import json
import os
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Final

import attrs

from agentcall import limits

if TYPE_CHECKING:
    from agentcall.listener.ceiling import Ceiling
    from agentcall.local.config import Config
    from agentcall.local.home import Home
    from agentcall.local.keystore import LocalKeys
    from agentcall.wire.http import KeysResponse

OK: Final = "pass"
FAIL: Final = "fail"
WARN: Final = "warn"
SUBPROCESS_TIMEOUT_S: Final = 10.0
SYSTEMCTL_TIMEOUT_S: Final = 5.0
MAX_SHOWN: Final = 200
RESUME_HINT: Final = "run `agentcall setup --resume` (it publishes missing key records)"
# The relay does not say why a token fails (a guess must learn nothing), so both reasons.
CREDENTIALS_REFUSED: Final = (
    "the relay does not accept this installation's token: it was rotated on another copy of "
    "this installation, or an organisation admin removed you"
)
CREDENTIALS_HINT: Final = (
    "ask an organisation admin (`agentcall members list` shows whether you were removed); "
    "if you were, they can invite you again"
)


@attrs.frozen
class Check:
    """One line of the report: ``status`` is pass, fail (with a fix in ``hint``) or warn."""

    name: str
    status: str
    detail: str | None = None
    hint: str | None = None

    def to_json(self) -> dict[str, str]:
        body = {"name": self.name, "status": self.status}
        if self.detail is not None:
            body["detail"] = self.detail
        if self.hint is not None:
            body["hint"] = self.hint
        return body


# Runs argv with a timeout; raises subprocess.TimeoutExpired, or OSError if it cannot start.
Runner = Callable[[Sequence[str], float], "subprocess.CompletedProcess[str]"]


def run_command(argv: Sequence[str], timeout_s: float) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        list(argv),
        capture_output=True,
        text=True,
        errors="replace",
        timeout=timeout_s,
        stdin=subprocess.DEVNULL,
        check=False,
    )


def which_on_path(program: str, path: str) -> str | None:
    return shutil.which(program, path=path)


def _guard_argv() -> list[str]:
    from agentcall.listener.guardwire import guard_argv

    return guard_argv()


def _managed_paths() -> tuple[str, ...]:
    from agentcall.listener.guardwire import MANAGED_SETTINGS_PATHS

    return MANAGED_SETTINGS_PATHS


@attrs.frozen
class DoctorDeps:
    """Everything doctor reaches outside the process with; tests pass fakes."""

    make_api: Callable[[Any, Config], Any]  # (reactor, config) -> RelayApi
    run_network: Callable[..., Any]  # run_on_reactor
    run: Runner = run_command
    which: Callable[[str, str], str | None] = which_on_path  # (program, PATH)
    guard_argv: Callable[[], list[str]] = _guard_argv
    managed_settings: Callable[[], tuple[str, ...]] = _managed_paths
    environ: Mapping[str, str] = attrs.field(factory=lambda: os.environ)
    clock: Callable[[], float] = time.time  # now, for the key expiry line

    @property
    def path(self) -> str:
        return self.environ.get("PATH", os.defpath)


def _short(text: str) -> str:
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    last = lines[-1] if lines else ""
    return last if len(last) <= MAX_SHOWN else last[: MAX_SHOWN - 1] + "…"


def _problem(exc: BaseException) -> str:
    from agentcall.errors import ApiError

    if isinstance(exc, ApiError):
        return f"the relay refused: {exc.message} ({exc.code})"
    return str(exc) or type(exc).__name__


# --- installation ------------------------------------------------------------------------------


def installation(deps: DoctorDeps) -> Check:
    import agentcall

    package = os.path.dirname(os.path.abspath(agentcall.__file__))
    detail = f"agentcall {agentcall.__version__} from {package} (Python {sys.executable})"
    found: dict[str, str] = {}  # resolved -> as found, first one first
    for directory in deps.path.split(os.pathsep):
        candidate = os.path.join(directory, "agentcall")
        if directory and os.path.isfile(candidate) and os.access(candidate, os.X_OK):
            found.setdefault(os.path.realpath(candidate), candidate)
    if len(found) > 1:
        return Check(
            "installation",
            WARN,
            f"{detail}; several agentcall programs on PATH: {', '.join(found.values())}",
            "the first one runs; remove the others so the listener and you use the same one",
        )
    return Check("installation", OK, detail)


# --- keys and relay ----------------------------------------------------------------------------


def local_keys(home: Home, config: Config) -> tuple[Check, LocalKeys | None]:
    from agentcall.crypto.keys import fingerprint
    from agentcall.local.home import LocalStateError
    from agentcall.local.keystore import load_keys

    try:
        keys = load_keys(home)
    except LocalStateError as exc:
        return Check("keys", FAIL, str(exc), "restore keys.json from a backup, or re-enrol"), None
    if (keys.address, keys.relay_origin) != (config.address, config.relay_origin):
        detail = (
            f"keys.json is for {keys.address} at {keys.relay_origin}, config.json for "
            f"{config.address} at {config.relay_origin}"
        )
        return Check("keys", FAIL, detail, "put back the keys.json of this enrolment"), None
    detail = (
        f"identity {fingerprint(keys.identity_record.record)}, encryption epoch "
        f"{keys.epochs[-1].epoch} ({keys.epochs[-1].key_id})"
    )
    return Check("keys", OK, detail), keys


@attrs.frozen
class RelayFacts:
    """What the relay said; an ``*_error`` is set where it could not say."""

    status_error: str | None = None
    relay_origin: str | None = None
    version: str | None = None
    keys: KeysResponse | None = None
    keys_error: str | None = None
    # The keys fetch was refused 401: nothing authenticated will work.
    token_refused: bool = False
    online: bool | None = None
    presence_error: str | None = None
    offline_delivery: bool | None = None
    offline_error: str | None = None


async def ask_relay(reactor: Any, deps: DoctorDeps, config: Config, presence: bool) -> RelayFacts:
    try:
        api = deps.make_api(reactor, config)
        status = await api.status()
    except Exception as exc:
        return RelayFacts(status_error=_problem(exc))
    keys: KeysResponse | None = None
    keys_error = presence_error = offline_error = None
    online: bool | None = None
    offline: bool | None = None
    token_refused = False
    try:
        keys = await api.get_keys(config.handle)
    except Exception as exc:
        keys_error = _problem(exc)
        from agentcall.errors import ApiError, ApiErrorCode

        token_refused = isinstance(exc, ApiError) and exc.code is ApiErrorCode.UNAUTHORIZED
    if presence:
        try:
            online = (await api.presence()).online
        except Exception as exc:
            presence_error = _problem(exc)
    try:
        offline = (await api.whoami()).offline_delivery
    except Exception as exc:
        offline_error = _problem(exc)
    return RelayFacts(
        None,
        status.relay_origin,
        status.version,
        keys,
        keys_error,
        token_refused,
        online,
        presence_error,
        offline,
        offline_error,
    )


def relay(facts: RelayFacts, config: Config, keys: LocalKeys | None) -> list[Check]:
    where = config.relay_url + (" (from AGENTCALL_RELAY)" if config.relay_overridden else "")
    if facts.status_error is not None:
        hint = "check the network and relay_url; a private CA needs ca_file or SSL_CERT_FILE"
        return [Check("relay", FAIL, f"{where}: {facts.status_error}", hint)]
    if facts.relay_origin != config.relay_origin:
        detail = f"{where} is {facts.relay_origin}, but this installation enrolled at "
        hint = "point relay_url (or AGENTCALL_RELAY) at the relay you enrolled with"
        return [Check("relay", FAIL, detail + config.relay_origin, hint)]
    version = f" (relay {facts.version})" if facts.version else ""
    checks = [Check("relay", OK, f"{where} answers{version}")]
    if keys is None:
        checks.append(Check("published keys", WARN, "unproven: the local keys did not load"))
    elif facts.token_refused:
        checks.append(Check("credentials", FAIL, CREDENTIALS_REFUSED, CREDENTIALS_HINT))
    elif facts.keys is None:
        checks.append(Check("published keys", FAIL, str(facts.keys_error), RESUME_HINT))
    else:
        checks.append(_compare_keys(facts.keys, keys))
    return checks


def _compare_keys(served: KeysResponse, keys: LocalKeys) -> Check:
    name = "published keys"
    if served.identity.record != keys.identity_record.record:
        detail = "the relay serves a different identity key for this address than keys.json"
        return Check(name, FAIL, detail, "ask an admin to reset the enrolment, then re-enrol")
    if served.encryption is None:
        return Check(name, FAIL, "the relay has no encryption key for you", RESUME_HINT)
    record, current = served.encryption.record, keys.epochs[-1]
    if record.key_id == current.key_id:
        return Check(name, OK, f"identity and encryption epoch {record.epoch} match keys.json")
    if keys.key_for(record.key_id, record.epoch) is not None:
        detail = f"the relay serves epoch {record.epoch}; the current one is {current.epoch}"
        return Check(name, WARN, detail, "the listener publishes it; or " + RESUME_HINT)
    detail = f"the relay serves encryption key {record.key_id}, which keys.json does not hold"
    return Check(name, FAIL, detail + ": callers cannot reach you", RESUME_HINT)


# --- listener ----------------------------------------------------------------------------------


def listener_service(home: Home, deps: DoctorDeps) -> Check:
    from agentcall.service_unit import JOURNAL_COMMAND, UNIT_NAME, unit_path

    name = "listener service"
    own = "run `agentcall listen` under your own supervisor (launchd, a container, tmux)"
    if deps.which("systemctl", deps.path) is None:
        return Check(name, WARN, "no systemctl here: no service manager to ask", own)
    unit = unit_path(home, deps.environ)
    try:
        done = deps.run(["systemctl", "--user", "is-active", UNIT_NAME], SYSTEMCTL_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        return Check(name, WARN, f"systemctl --user did not answer in {SYSTEMCTL_TIMEOUT_S:g} s")
    except OSError as exc:
        return Check(name, WARN, f"cannot run systemctl: {exc.strerror or exc}")
    if done.returncode == 0:
        return Check(name, OK, f"{UNIT_NAME} is active")
    state = _short(done.stdout) or _short(done.stderr) or f"exit status {done.returncode}"
    if not unit.exists():
        detail = f"no systemd user unit at {unit} ({state})"
        return Check(name, WARN, detail, "`agentcall setup --resume` installs it; or " + own)
    return Check(
        name,
        FAIL,
        f"{UNIT_NAME} is installed but not active ({state})",
        f"run `systemctl --user restart {UNIT_NAME}`; its output is in `{JOURNAL_COMMAND}`",
    )


def listener_connected(facts: RelayFacts, config: Config) -> Check:
    name = "listener connected"
    if facts.online:
        return Check(name, OK, "the relay sees this installation's listener connected")
    if facts.online is False:
        return Check(
            name,
            FAIL,
            f"no listener of yours is connected: calls to {config.address} fail as offline",
            "start it: `systemctl --user restart agentcall-listener`, or `agentcall listen`",
        )
    why = facts.presence_error or facts.status_error or "the relay did not say"
    return Check(name, WARN, f"unproven: {why}")


def offline_delivery(facts: RelayFacts, config: Config) -> Check:
    """Whether the relay keeps calls for this installation while it is offline or busy."""
    name = "offline delivery"
    if facts.offline_delivery is None:
        why = facts.offline_error or facts.status_error or "the relay did not say"
        return Check(name, WARN, f"unproven: {why}")
    if not facts.offline_delivery:
        return Check(
            name,
            OK,
            "disabled: calls while you are offline or busy fail "
            "(`agentcall access --offline enabled` has the relay keep them)",
        )
    if config.caller_only:
        return Check(
            name,
            WARN,
            "enabled, but this installation answers no calls: calls kept for you expire unanswered",
            "`agentcall access --offline disabled`",
        )
    hours = limits.MAILBOX_TTL_S / 3600
    return Check(
        name,
        OK,
        f"enabled: the relay keeps calls for you while you are offline or busy (up to {hours:g} h)",
    )


# --- the agent ---------------------------------------------------------------------------------

_AUTH: Final = {
    "claude": (("auth", "status"), "run `claude auth login` (or start `claude` and /login)"),
    "codex": (("login", "status"), "run `codex login`"),
}


def agent(config: Config, deps: DoctorDeps) -> list[Check]:
    from agentcall.wire.http import AgentKind

    kind = config.agent_kind
    if kind is AgentKind.COMMAND and config.agent_command is not None:
        program = config.agent_command[0]
    else:
        program = str(kind)
    found = deps.which(program, deps.path)
    if found is None:
        detail = f"`{program}` is not found on PATH (as this shell sees it)"
        return [Check("agent", FAIL, detail, "install it, or rerun setup with another --agent")]
    checks = [Check("agent", OK, f"{kind}: {found}")]
    if kind is AgentKind.COMMAND:
        detail = f"{found} is executable; whether it is signed in anywhere is its own affair"
        checks.append(Check("agent login", OK, detail))
        return checks
    words, hint = _AUTH[str(kind)]
    shown = f"`{program} {' '.join(words)}`"
    try:
        done = deps.run([found, *words], SUBPROCESS_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        checks.append(Check("agent login", WARN, f"unproven: {shown} did not answer in time"))
        return checks
    except OSError as exc:
        checks.append(Check("agent login", FAIL, f"{shown} cannot run: {exc.strerror or exc}"))
        return checks
    if done.returncode == 0:
        checks.append(Check("agent login", OK, f"{shown} says you are logged in"))
    else:
        said = _short(done.stderr) or _short(done.stdout)
        detail = f"{shown} exited {done.returncode}" + (f": {said}" if said else "")
        checks.append(Check("agent login", FAIL, detail, hint))
    return checks


# --- the tool guard ----------------------------------------------------------------------------


def _payload(target: str, cwd: str) -> bytes:
    body = {
        "hook_event_name": "PreToolUse",
        "tool_name": "Read",
        "tool_input": {"file_path": target},
        "cwd": cwd,
        "tool_use_id": "toolu_agentcall_doctor",
    }
    return json.dumps(body).encode()


def _run_guard(argv: list[str], target: str, cwd: str, env: dict[str, str]) -> tuple[int, str]:
    """The guard's exit status and its output (stdout, else stderr); -1 when it could not run."""
    try:
        done = subprocess.run(
            argv,
            input=_payload(target, cwd),
            capture_output=True,
            env=env,
            cwd=cwd,
            timeout=SUBPROCESS_TIMEOUT_S,
            check=False,
        )
    except subprocess.TimeoutExpired:
        return -1, f"no verdict within {SUBPROCESS_TIMEOUT_S:g} s"
    except OSError as exc:
        return -1, f"cannot run: {exc.strerror or exc}"
    out = done.stdout.decode("utf-8", "replace").strip()
    return done.returncode, out or _short(done.stderr.decode("utf-8", "replace"))


def _logged_decisions(path: str) -> list[object]:
    try:
        with open(path, "rb") as log:
            lines = log.read().splitlines()
    except OSError:
        return []
    decisions: list[object] = []
    for line in lines:
        try:
            entry = json.loads(line)
        except ValueError:
            continue
        decisions.append(entry.get("decision") if isinstance(entry, dict) else None)
    return decisions


def guard(home: Home, config: Config, deps: DoctorDeps) -> list[Check]:
    from agentcall.guard.main import DENY_OUTPUT
    from agentcall.listener import guardwire
    from agentcall.wire.http import AgentKind

    if config.agent_kind is AgentKind.COMMAND:
        detail = "a custom agent command runs without the tool guard; nothing bounds its tools"
        return [Check("tool guard", WARN, detail)]
    roots = [os.path.realpath(root) for root in config.read_roots if os.path.isdir(root)]
    if not roots:
        detail = "none of the read roots exists, so calls have no working directory"
        return [Check("tool guard", FAIL, detail, "fix read_roots in config.json")]
    argv, root = deps.guard_argv(), roots[0]
    secret = os.path.join(str(home.user_home), ".ssh", "id_ed25519")
    inside = os.path.join(root, "agentcall-doctor-probe.txt")
    checks: list[Check] = []
    with tempfile.TemporaryDirectory(prefix="agentcall-doctor-") as scratch:
        log = os.path.join(scratch, "tools.log")
        env = {k: v for k, v in deps.environ.items() if not k.startswith("AGENTCALL_")}
        env.update(
            guardwire.guard_env(
                roots=config.read_roots,
                write_root=None,
                caps={"read"},
                call_id="doctor",
                log_path=log,
                home=home.user_home,
                extra_denied=guardwire.default_extra_denied(home.tasks_dir, home.state_dir),
            )
        )
        denied = _run_guard(argv, secret, root, env)
        allowed = _run_guard(argv, inside, root, env)
        logged = _logged_decisions(log)
        if config.agent_kind is AgentKind.CLAUDE:
            checks.append(_claude_settings(deps, os.path.join(scratch, "no-claude-config")))
    wrong = []
    if denied != (0, DENY_OUTPUT):
        wrong.append(f"a Read of {secret} was not refused (exit {denied[0]}: {denied[1]!r})")
    if allowed != (0, ""):
        wrong.append(f"a Read in {root} was not let through (exit {allowed[0]}: {allowed[1]!r})")
    if not wrong and logged != ["deny", "allow"]:
        wrong.append(f"the guard did not log both decisions (tools.log had {logged!r})")
    if wrong:
        hint = f"reinstall agentcall; the listener runs `{shlex.join(argv)}` as the hook"
        return [Check("tool guard", FAIL, "; ".join(wrong), hint), *checks]
    detail = f"refused a Read of {secret}, let one in {root} through, and logged both"
    return [Check("tool guard", OK, detail), *checks]


def _claude_settings(deps: DoctorDeps, nowhere: str) -> Check:
    from agentcall.listener.guardwire import owner_settings_disable_hooks

    name = "claude settings"
    managed = owner_settings_disable_hooks(
        nowhere, environ=deps.environ, managed_paths=deps.managed_settings()
    )
    if managed is not None:
        detail = f'{managed}; managed settings apply even with --setting-sources "", so Claude'
        hint = "ask whoever manages this machine's Claude settings to allow hooks"
        return Check(name, FAIL, detail + " would answer calls without the guard", hint)
    mine = owner_settings_disable_hooks(environ=deps.environ, managed_paths=())
    if mine is not None:
        detail = f'{mine}; the listener starts Claude with --setting-sources "", so it cannot'
        return Check(name, WARN, detail + " switch the guard off during calls")
    return Check(name, OK, "no Claude settings switch hooks off")


# --- the kernel read boundary ------------------------------------------------------------------


def kernel_boundary(
    config: Config,
    *,
    probe: Callable[[], tuple[int, str]] | None = None,
    required: Callable[[], bool] | None = None,
    isolated: Callable[[], bool] | None = None,
) -> Check:
    """Whether answering agents run inside the Landlock ruleset (``agentcall.confine``), and
    whether the kernel also keeps them from the owner's other processes."""
    from agentcall.confine import landlock
    from agentcall.confine.rights import NET_ABI
    from agentcall.wire.http import AgentKind

    name = "kernel read boundary"
    abi, why = (probe or landlock.probe)()
    needed = (required or _ceiling_requires_boundary)()
    if abi >= 1:
        from agentcall.confine.support import isolation_gaps

        kernel_gaps = isolation_gaps(abi)
        gaps = list(kernel_gaps)
        if config.agent_kind is AgentKind.CODEX and abi < NET_ABI:
            # Codex runs without its own sandbox inside the boundary, which cut its commands
            # off the network; this kernel's Landlock has no network rules to do it instead.
            gaps.insert(
                0,
                "Codex's commands are not kept off the network"
                f" (that needs ABI {NET_ABI}, Linux 6.7)",
            )
        if not gaps:
            detail = f"on, Landlock ABI {abi}; no UNIX sockets, signals or abstract sockets"
            return Check(name, OK, detail + " outside the run")
        detail = f"on, Landlock ABI {abi}; " + "; ".join(gaps)
        if kernel_gaps and (isolated or _ceiling_requires_isolation)():
            hint = "answer on Linux 6.12 or later (x86_64 or arm64)"
            return Check(name, FAIL, detail + "; the admin ceiling requires more", hint)
        return Check(name, WARN, detail)
    if needed:
        detail = f"off: {why}; the admin ceiling requires it, so no agent is started"
        hint = "answer on Linux 5.13 or later with Landlock enabled"
        return Check(name, FAIL, detail, hint)
    return Check(name, WARN, f"off: {why}; the tool guard is the only boundary")


def _admin_ceiling() -> Ceiling | None:
    """The machine's admin ceiling; None when there is none or it is unusable (which the
    admin ceiling check reports)."""
    from agentcall.cli import owner
    from agentcall.listener.ceiling import CeilingError

    try:
        return owner.load_admin_ceiling()
    except CeilingError:
        return None


def _ceiling_requires_isolation() -> bool:
    ceiling = _admin_ceiling()
    return ceiling is not None and ceiling.require_process_isolation


def _ceiling_requires_boundary() -> bool:
    ceiling = _admin_ceiling()
    return ceiling is not None and ceiling.require_kernel_boundary


# --- coding agents calling through `agentcall mcp` -----------------------------------------------


def agent_tools(deps: DoctorDeps) -> list[Check]:
    """One line per coding agent ``agentcall install`` registered ``agentcall mcp`` with: pass
    while its entry still starts this agentcall, fail once it does not. Agents never
    installed into get no line (setup says how to install)."""
    from agentcall.cli.install import AGENTS, installed

    checks = []
    for agent in AGENTS:
        ok, detail = installed(agent, deps.environ)
        if ok:
            checks.append(Check(f"{agent} tools", OK, detail))
        elif not detail.startswith("not installed"):
            hint = f"run `agentcall install {agent}` again (or `--remove` it)"
            checks.append(Check(f"{agent} tools", FAIL, detail, hint))
    return checks
