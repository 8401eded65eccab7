"""``agentcall doctor``: is this installation able to place and answer calls, and if not, why.

Read-only: it changes no file, publishes nothing and places no call. The checks run in a fixed
order and each ends as ✓ (pass), ✗ (fail, with a one-line fix) or ! (unproven, or worth
knowing). The exit status is 1 when any check failed. The checks themselves live in
:mod:`agentcall.cli.doctor_checks`; this module orders them, adds the owner-control checks
(tasks, policy, ceiling, assertions, the agent's honest limits) and prints the report.
"""

from __future__ import annotations

import argparse
import sys
from typing import TYPE_CHECKING, Any, Final

if TYPE_CHECKING:
    from agentcall.cli.doctor_checks import Check, DoctorDeps
    from agentcall.listener.policy import Policy
    from agentcall.local.config import Config
    from agentcall.local.home import Home

DESCRIPTION = """\
Check this installation, in order: the installed program, private-file permissions, config,
keys and when the current encryption key expires (! when fewer than 6 days remain: nothing
has renewed it; ✗ once expired; the identity key does not expire), whether a recovery code
was issued (! when none was), the relay and the keys it publishes for you, whether the
relay keeps calls for you while you are offline or busy (offline delivery), the listener
(systemd user service, and whether the relay sees it connected), the agent CLI (on PATH,
logged in), the tool guard (the real guard program is run on two sample tool calls: a read of
~/.ssh/id_ed25519 must be refused, a read inside your first read root let through), Claude
settings that would switch hooks off, tasks, policy, the admin ceiling and assertions, and
what the agent cannot bound.

Each line is ✓ (pass), ✗ (fail, followed by how to fix it) or ! (unproven, or worth knowing).
The exit status is 1 when any check failed. Nothing is changed and no call is placed.
A caller-only installation skips the listener, agent and guard checks."""

EPILOG = """\
examples:
  agentcall doctor
  agentcall doctor --json | jq '.checks[] | select(.status != "pass")'"""

MARKS: Final = {"pass": "✓", "fail": "✗", "warn": "!"}
CALLER_ONLY_NOTE: Final = (
    "caller-only installation: it answers no calls, so the listener, agent and tool guard "
    "checks were skipped"
)

# Replaced in tests; None means the real relay, systemctl and agent CLIs.
DEPS: DoctorDeps | None = None


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--json",
        action="store_true",
        help='print one JSON object: {"ok": bool, "checks": [{"name", "status", …}]}',
    )


def _real_deps() -> DoctorDeps:
    from agentcall.cli.call import run_on_reactor
    from agentcall.cli.doctor_checks import DoctorDeps

    def make_api(reactor: Any, config: Config) -> Any:
        from agentcall.client.api import Credentials, RelayApi

        credentials = Credentials(config.org, config.handle, config.token)
        return RelayApi(reactor, config.relay, credentials, config.ca_file)

    return DoctorDeps(make_api=make_api, run_network=run_on_reactor)


# --- owner control -------------------------------------------------------------------------------


def _owner_checks(home: Home, config: Config) -> tuple[list[Check], bool]:
    """Tasks, policy.json, the admin ceiling and every assertion, as ``lint`` judges them;
    and whether any task that can run has a shell (exec)."""
    from agentcall.cli import owner
    from agentcall.cli.doctor_checks import FAIL, OK, WARN, Check
    from agentcall.cli.policy_report import lint_notes
    from agentcall.listener.admission import check_assertions, runnable_tools
    from agentcall.listener.ceiling import CeilingError
    from agentcall.listener.policy import PolicyError, load_policy
    from agentcall.listener.tasks import TaskSet, load_tasks

    fix_task = "fix that SKILL.md (`agentcall lint` checks again)"
    try:
        tasks = load_tasks(home.tasks_dir, config.read_roots)
    except PolicyError as exc:
        # Someone else could have written a task: the listener refuses every call over it.
        detail = f"{exc.path}: {exc.problem}; no call is answered until it is fixed"
        checks = [Check("tasks", FAIL, detail, exc.fix or fix_task)]
        tasks = TaskSet()
    else:
        checks = [Check("tasks", FAIL, str(problem), fix_task) for problem in tasks.problems]
        if not tasks.problems:
            checks.append(Check("tasks", OK, f"all load: {', '.join(sorted(tasks.tasks))}"))
    policy: Policy | None = None
    try:
        policy = load_policy(home.policy_path)
    except PolicyError as exc:
        hint = exc.fix or "fix it by hand (it is never overwritten)"
        checks.append(Check("policy", FAIL, f"{exc.path}: {exc.problem}", hint))
    else:
        offer = ", ".join(policy.default_offer) or "nothing"
        detail = f"default access {policy.default_access}, default offer: {offer}"
        checks.append(Check("policy", OK, f"{detail}; {len(policy.callers)} named caller(s)"))
    try:
        ceiling = owner.load_admin_ceiling()
    except CeilingError as exc:
        detail = f"{exc}: no call is answered until it is fixed"
        checks.append(Check("admin ceiling", FAIL, detail, "ask your administrator to fix it"))
        return checks, False
    where = owner.ceiling_path()
    managed = f"managed by {where}" if ceiling is not None else f"unmanaged (no {where})"
    checks.append(Check("admin ceiling", OK, managed))
    shell = any("exec" in tools for tools in runnable_tools(ceiling, tasks).values())
    if policy is None:
        return checks, shell
    failures = check_assertions(policy, ceiling, tasks)
    hint = "change the policy or the tasks until it holds (`agentcall policy` shows both)"
    checks += [Check("assertions", FAIL, str(failure), hint) for failure in failures]
    if not failures:
        count = len(policy.assertions) + (len(ceiling.assertions) if ceiling else 0)
        checks.append(Check("assertions", OK, f"{count} hold" if count else "none declared"))
    layers = owner.Layers(home, config, config.read_roots, tasks)
    notes = lint_notes(policy, ceiling, layers)
    if notes:
        checks.append(Check("policy notes", WARN, "; ".join(notes)))
    return checks, shell


def _limits(config: Config, shell: bool) -> Check:
    """What the agent itself cannot bound; for Claude a warning only when a task has a shell."""
    from agentcall.cli.doctor_checks import OK, WARN, Check
    from agentcall.cli.policy_report import kernel_abi, limits_for
    from agentcall.wire.http import AgentKind

    kind = config.agent_kind
    abi = kernel_abi()
    # Without the kernel boundary Claude's Bash is only recorded; with it, what stays open
    # (the network) is worth a warning only where a task has a shell.
    status = WARN if (kind is not AgentKind.CLAUDE and abi < 1) or shell else OK
    return Check("limits", status, f"{kind}: " + "; ".join(limits_for(kind, abi)))


# --- the run -------------------------------------------------------------------------------------


def _checks(deps: DoctorDeps) -> tuple[list[Check], list[str]]:
    from agentcall.cli import doctor_checks as dc
    from agentcall.local.config import NotSetUp, load_config
    from agentcall.local.home import Home, LocalStateError

    checks = [dc.installation(deps)]
    try:
        home = Home.from_environ(deps.environ)
    except LocalStateError as exc:
        return [*checks, dc.Check("private files", dc.FAIL, str(exc), "fix HOME")], []
    problems = home.private_file_problems()
    checks += [
        dc.Check("private files", dc.FAIL, f"{p.path}: {p.problem}", p.fix) for p in problems
    ]
    if not problems:
        checks.append(
            dc.Check("private files", dc.OK, f"{home.state_dir} and its files: 0700/0600")
        )
    try:
        config = load_config(home)
    except NotSetUp as exc:
        hint = "run `agentcall setup --invite INVITE --handle HANDLE`"
        return [*checks, dc.Check("config", dc.FAIL, str(exc), hint)], []
    except LocalStateError as exc:
        hint = "fix config.json by hand (the message names the field), or run setup again"
        return [*checks, dc.Check("config", dc.FAIL, str(exc), hint)], []
    kind = config.agent_kind or "none (caller-only)"
    checks.append(dc.Check("config", dc.OK, f"{config.address} ({config.role}), agent {kind}"))
    key_check, keys = dc.local_keys(home, config)
    checks.append(key_check)
    if keys is not None:
        from agentcall.cli.doctor_keys import key_expiry

        checks.append(key_expiry(keys, deps.clock(), caller_only=config.caller_only))
    from agentcall.cli.doctor_keys import recovery_code

    checks.append(recovery_code(home))
    checks += dc.agent_tools(deps)

    from agentcall.cli.card import doctor_fetch

    async def work(reactor: Any) -> tuple[dc.RelayFacts, object]:
        facts = await dc.ask_relay(reactor, deps, config, presence=not config.caller_only)
        return facts, await doctor_fetch(reactor, deps, config, facts)

    facts, card = deps.run_network(work)
    checks += dc.relay(facts, config, keys)
    checks.append(dc.offline_delivery(facts, config))
    notes: list[str] = []
    if config.caller_only:
        notes.append(CALLER_ONLY_NOTE)
    else:
        checks.append(dc.listener_service(home, deps))
        checks.append(dc.listener_connected(facts, config))
        checks += dc.agent(config, deps)
        checks += dc.guard(home, config, deps)
        checks.append(dc.kernel_boundary(config))
    owned, shell = _owner_checks(home, config)
    checks += owned
    if not config.caller_only:
        checks.append(_limits(config, shell))
    if keys is not None and facts.status_error is None and not facts.token_refused:
        from agentcall.cli.card import doctor_check

        checks.append(doctor_check(home, config, keys, card))
    return checks, notes


def _render(checks: list[Check], notes: list[str]) -> str:
    from agentcall.cli.render import safe_cell

    lines = []
    for check in checks:
        detail = f": {safe_cell(check.detail)}" if check.detail else ""
        lines.append(f"{MARKS[check.status]} {safe_cell(check.name)}{detail}")
        if check.hint:
            lines.append(f"    fix: {safe_cell(check.hint)}")
    lines += [f"note: {safe_cell(note)}" for note in notes]
    failed = sum(check.status == "fail" for check in checks)
    warned = sum(check.status == "warn" for check in checks)
    if failed:
        lines.append(f"doctor: {failed} check(s) failed, {warned} warning(s)")
    else:
        lines.append(f"doctor: all checks passed, {warned} warning(s)")
    return "\n".join(lines)


def run(args: argparse.Namespace) -> int:
    from agentcall.cli.render import safe_json

    checks, notes = _checks(DEPS or _real_deps())
    ok = not any(check.status == "fail" for check in checks)
    if args.json:
        body: dict[str, Any] = {"ok": ok, "checks": [check.to_json() for check in checks]}
        if notes:
            body["notes"] = notes
        print(safe_json(body))
    else:
        print(_render(checks, notes))
    sys.stdout.flush()
    return 0 if ok else 1
