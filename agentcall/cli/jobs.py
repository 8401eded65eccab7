"""``agentcall jobs list|get|cancel``: calls the relay kept as mailbox jobs, and their answers.

``get`` prints an answered job's answer exactly as ``agentcall call`` prints a reply (the same
:class:`~agentcall.cli.call.Reporter`: stdout, terminal-safe, the same ``--json`` object plus
``job_id`` and ``state``); the work is :mod:`agentcall.caller.jobsflow` over
:mod:`agentcall.caller.jobs`, run by the listener service when one is there to hand the
command to (:mod:`agentcall.cli.viaservice`), else in this process. Both paths end in one
:class:`~agentcall.wire.local.LocalJobsEnded`, rendered here. Exit statuses: 0 answered
(for ``list``, done; for ``cancel``, the job has ended, cancelled or answered first),
:data:`EXIT_PENDING` when the job has not ended yet, 1 for a job that ended without an answer
(``get``) or any other failure, with one line on stderr.
"""

from __future__ import annotations

import argparse
import sys
from typing import TYPE_CHECKING, Any, Final

from agentcall import limits
from agentcall.cli.call import SUGGESTED_WAIT_S

if TYPE_CHECKING:
    from agentcall.cli.call import Reporter
    from agentcall.wire.http import JobInfo
    from agentcall.wire.local import LocalJobsEnded

# EX_TEMPFAIL of sysexits.h: "try again later". `call` uses 0, 1 and 2 (usage) only.
EXIT_PENDING: Final = 75
MAX_WAIT_S: Final = int(limits.MAILBOX_TTL_S)
# How long `jobs cancel` follows a delivered or running job by default: the listener kills the
# agent within seconds of being told, so a minute covers a slow listener without hanging.
CANCEL_WAIT_S: Final = 60

DESCRIPTION = f"""\
Calls the relay kept for you as mailbox jobs, and their answers.

When you call an agent whose owner turned on offline delivery while that agent is offline or
busy, the relay keeps your sealed call as a job and `agentcall call` prints its job id. The
callee's listener takes it when it is back, and the answer waits at the relay, sealed, until
you fetch it. A job and its answer are kept at most {limits.MAILBOX_TTL_S / 3600:g} hours.

  list    your jobs, sent and received, newest first, with state and age
  get     one job's state; once answered, its answer exactly as `agentcall call` prints it
  cancel  cancel a job you sent (a running one is stopped like a live call; waits until it has)

Like `agentcall call`, these go through the listener service when it runs on this machine
(it holds the keys and the relay connection; --wait is its long poll, and Ctrl-C stops it),
and talk to the relay from this process when it does not, or when AGENTCALL_RELAY is set. The
output and exit statuses are the same either way.

States: queued, delivered, running (pending); answered, failed (with a reason:
delivery_failed, indeterminate_execution, revoked, rejected), cancelled, expired.

Exit status of `get`: 0 with the answer; {EXIT_PENDING} when the job is still pending (ask again
later, or wait longer); 1 when it ended without an answer (the reason's code is printed:
delivery_failed, indeterminate_execution, revoked, protocol_error, canceled, expired) or on
any other failure.

Exit status of `cancel`: 0 once the job has ended: cancelled, or answered (or failed) before
the cancel reached it (an answer is kept: fetch it with `get`); {EXIT_PENDING} when a delivered or
running job has not stopped within --wait (its listener has been told to stop it); 1 when the
job had already ended or on any other failure. Like calls, jobs cannot be used from inside an
agent answering a call."""

EPILOG = f"""\
examples:
  agentcall jobs list
  agentcall jobs list @acme/ken --json | jq -r '.[] | select(.state == "answered") | .job_id'
  agentcall jobs get @acme/ken 1b4e28ba-2fa1-4d3b-a3f5-ef19b5a7633b --wait {SUGGESTED_WAIT_S}
  agentcall jobs cancel @acme/ken 1b4e28ba-2fa1-4d3b-a3f5-ef19b5a7633b"""


def _job_id(text: str) -> str:
    from agentcall import ids

    value = text.lower() if text.isascii() else text
    if not ids.is_job_id(value):
        raise argparse.ArgumentTypeError(
            f"{text!r} is not a job id (the id `agentcall call` printed, like "
            "1b4e28ba-2fa1-4d3b-a3f5-ef19b5a7633b)"
        )
    return value


def _wait(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number of seconds") from None
    if not 0 <= value <= MAX_WAIT_S:
        raise argparse.ArgumentTypeError(f"the wait must be 0..{MAX_WAIT_S} seconds")
    return value


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from agentcall.cli.main import add_subcommand

    sub = parser.add_subparsers(dest="jobs_command", metavar="SUBCOMMAND", required=True)
    listing = add_subcommand(
        sub,
        "list",
        "Your jobs, sent and received, newest first.",
        "Your jobs, sent and received (at most the newest "
        f"{limits.MAX_JOBS_LISTED}), newest first: job id, side, the other party, state (with "
        "the reason of a failure), age and expiry. ADDRESS keeps only the jobs with that "
        "person. --json prints one JSON array of objects with job_id, side, address (the "
        "other party), caller, callee, state, reason, attempts, cancel_requested, created_at "
        "and expires_at (Unix seconds, UTC).",
        "agentcall jobs list @acme/ken",
    )
    listing.add_argument(
        "address", metavar="ADDRESS", nargs="?", help="only jobs with this contact or address"
    )
    listing.add_argument("--json", action="store_true", help="print one JSON array")
    get = add_subcommand(
        sub,
        "get",
        "One job's state, and its answer once answered.",
        "One job's state (on stderr); once answered, its answer on stdout exactly as "
        "`agentcall call` prints it. --wait blocks until the job ends or SECONDS have "
        f"passed. Exit 0 with the answer, {EXIT_PENDING} while still pending, 1 when it ended "
        "without an answer (with the reason's code) or on any other failure. --json prints "
        "the object `agentcall call --json` prints, plus job_id and state (a pending job: "
        f'ok false, code "pending").',
        f"agentcall jobs get @acme/ken 1b4e28ba-2fa1-4d3b-a3f5-ef19b5a7633b --wait "
        f"{SUGGESTED_WAIT_S}",
    )
    get.add_argument("address", metavar="ADDRESS", help="the agent you called (or who called)")
    get.add_argument("job_id", metavar="JOB_ID", type=_job_id, help="as `agentcall call` printed")
    get.add_argument(
        "--wait",
        type=_wait,
        default=0,
        metavar="SECONDS",
        help=f"wait up to this long for the job to end (0..{MAX_WAIT_S}; default 0: just look)",
    )
    get.add_argument("--json", action="store_true", help="print one JSON object")
    cancel = add_subcommand(
        sub,
        "cancel",
        "Cancel a job you sent.",
        "Cancel a job you sent. A queued job is removed at once. A delivered or running one "
        "is stopped like a live call (its listener kills the agent's process group), and "
        f"this waits up to --wait SECONDS (default {CANCEL_WAIT_S}) for it to end, then says "
        "how it ended. Exit 0 once it has ended: cancelled, or answered (or failed) before the "
        "cancel reached it (an answer is kept; the command that fetches it is printed). Exit "
        f"{EXIT_PENDING} when it has not ended within the wait (or with --wait 0): its "
        "listener has been told to stop it, and `agentcall jobs get` shows when it has. Exit 1 "
        "when the job had already ended or on any other failure. --json prints one object: ok "
        "and the job as `jobs list --json` shows it, its final state included (not ended: ok "
        'false, code "pending", pending true). Only the caller can cancel a job.',
        "agentcall jobs cancel @acme/ken 1b4e28ba-2fa1-4d3b-a3f5-ef19b5a7633b",
    )
    cancel.add_argument("address", metavar="ADDRESS", help="the agent you called")
    cancel.add_argument(
        "job_id", metavar="JOB_ID", type=_job_id, help="as `agentcall call` printed"
    )
    cancel.add_argument(
        "--wait",
        type=_wait,
        default=CANCEL_WAIT_S,
        metavar="SECONDS",
        help=f"wait up to this long for a delivered or running job to stop (0..{MAX_WAIT_S}; "
        f"default {CANCEL_WAIT_S}; 0: do not wait)",
    )
    cancel.add_argument("--json", action="store_true", help="print one JSON object")


# --- showing -------------------------------------------------------------------------------------


def job_json(info: JobInfo) -> dict[str, object]:
    """One job as ``--json`` shows it (never an answer: lists carry none)."""
    return {
        "job_id": info.job_id,
        "side": str(info.side),
        "address": info.peer,
        "caller": info.caller,
        "callee": info.callee,
        "state": str(info.state),
        "reason": None if info.reason is None else str(info.reason),
        "attempts": info.attempts,
        "cancel_requested": info.cancel_requested,
        "created_at": info.created_at,
        "expires_at": info.expires_at,
    }


def age(seconds: float) -> str:
    """A short age: ``42s``, ``5m``, ``3h``, ``2d``."""
    seconds = max(0, int(seconds))
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size:
            return f"{seconds // size}{unit}"
    return f"{seconds}s"


def _state(info: JobInfo) -> str:
    said = str(info.state)
    if info.reason is not None:
        said += f" ({info.reason})"
    if info.cancel_requested and info.state in (info.state.DELIVERED, info.state.RUNNING):
        said += ", cancelling"
    return said


def render_list(jobs: list[JobInfo], now: float) -> str:
    from agentcall.cli.call import when

    if not jobs:
        return "no jobs"
    rows = [["JOB ID", "SIDE", "WITH", "STATE", "AGE", "EXPIRES"]]
    for info in jobs:
        rows.append(
            [
                info.job_id,
                str(info.side),
                info.peer,
                _state(info),
                age(now - info.created_at),
                when(info.expires_at),
            ]
        )
    # Every column but the last is padded to its widest cell.
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    return "\n".join(
        "  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)).rstrip()
        for row in rows
    )


def _status_line(info: JobInfo, address: str, pending: bool, now: float) -> str:
    way = "to" if str(info.side) == "sent" else "from"
    tries = f", attempt {info.attempts}" if info.attempts and pending else ""
    return (
        f"job {info.job_id} {way} {address}: {_state(info)}{tries}, "
        f"{age(now - info.created_at)} old"
    )


# --- running -------------------------------------------------------------------------------------


def run(args: argparse.Namespace) -> int:
    from agentcall.cli import call as call_cli
    from agentcall.cli import viaservice
    from agentcall.wire.local import EndKind, LocalEnded, LocalJobs

    extra = None if args.jobs_command == "list" else {"job_id": args.job_id}
    report = call_cli.Reporter(args.json, extra)
    call_cli.refuse_nested(report)
    try:
        request = LocalJobs(
            args.jobs_command,
            args.address,
            getattr(args, "job_id", None),
            getattr(args, "wait", 0),
        )
    except ValueError:
        # Nothing the service could take (an ADDRESS longer than any name): the direct path
        # words the refusal as it always has.
        request = None
    # Through the running service when there is one (no Twisted, no crypto in this process),
    # else talking to the relay from here.
    try:
        ended = None if request is None else viaservice.jobs(request, _progress)
    except viaservice.ServiceTrouble as exc:
        report.fail(exc.code, str(exc))
    if isinstance(ended, LocalEnded):
        if ended.kind is not EndKind.REFUSED:
            report.fail("service_error", "the local AgentCall service answered with a call")
        if ended.code != "bad_request":
            report.fail(str(ended.code), str(ended.message))
        # The service did not take the request (an older one knows only calls): nothing was
        # done there, so this process does it.
        ended = None
    if ended is None:
        ended = _directly(args, report)
    return _show(args, report, ended)


def _progress(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


def _directly(args: argparse.Namespace, report: Reporter) -> LocalJobsEnded:
    """The command run from this process, with the relay's API of its own."""
    from agentcall.caller.jobsflow import run_jobs
    from agentcall.cli import call as call_cli
    from agentcall.cli.main import CommandError

    try:
        home, config = call_cli.load_installation()
    except CommandError as exc:
        report.fail("not_set_up", str(exc))

    async def work(reactor: Any) -> LocalJobsEnded:
        api = call_cli.relay_api(reactor, config)
        return await run_jobs(
            reactor,
            home,
            config,
            _progress,
            api=api,
            command=args.jobs_command,
            target=args.address,
            job_id=getattr(args, "job_id", None),
            wait_s=getattr(args, "wait", 0),
        )

    return call_cli.run_on_reactor(work)


def _show(args: argparse.Namespace, report: Reporter, ended: LocalJobsEnded) -> int:
    """Print how the command ended: the same on either path."""
    from agentcall.cli.render import safe_json

    report.address = ended.address
    if ended.code is not None:
        report.fail(ended.code, str(ended.message))
    if args.jobs_command == "list":
        if args.json:
            print(safe_json([job_json(info) for info in ended.jobs]))
        else:
            print(render_list(list(ended.jobs), ended.now))
        return 0
    if ended.info is None or ended.address is None:
        raise ValueError("a get or cancel ends with its job")
    if args.jobs_command == "get":
        return _show_get(args, report, ended, ended.info, ended.address)
    return _show_cancel(args, report, ended.info, ended.address)


def _show_get(
    args: argparse.Namespace, report: Reporter, ended: LocalJobsEnded, info: JobInfo, address: str
) -> int:
    from agentcall.cli.render import safe_json

    pending = info.pending
    print(_status_line(info, address, pending, ended.now), file=sys.stderr, flush=True)
    report.extra["state"] = str(info.state)
    if info.reason is not None:
        report.extra["reason"] = str(info.reason)
    if pending:
        report.extra.update({"pending": True, "expires_at": info.expires_at})
        report.fail(
            "pending",
            f"job {info.job_id} has not ended yet ({info.state}); ask again with `agentcall "
            f"jobs get {address} {info.job_id} --wait {SUGGESTED_WAIT_S}`",
            exit_code=EXIT_PENDING,
        )
    if ended.result is not None:
        return report.ended(ended.result)
    # Answered, but sent to us: the answer is the caller's; the state is all there is.
    if args.json:
        print(safe_json({"ok": True, **job_json(info)}))
    return 0


def _show_cancel(args: argparse.Namespace, report: Reporter, info: JobInfo, address: str) -> int:
    from agentcall.cli.render import safe_json
    from agentcall.wire.http import JobState

    get = f"agentcall jobs get {address} {info.job_id}"
    if info.pending:
        # Like a pending `jobs get`: not ended yet, ask again later; the cancel itself stands.
        report.extra.update({**job_json(info), "pending": True})
        waited = f" after {args.wait} s" if args.wait else ""
        report.fail(
            "pending",
            f"job {info.job_id} to {address} is still {info.state}{waited}: its listener has "
            f"been told to stop it; `{get} --wait {SUGGESTED_WAIT_S}` shows when it has",
            exit_code=EXIT_PENDING,
        )
    if args.json:
        print(safe_json({"ok": True, **job_json(info)}))
    elif info.state is JobState.CANCELLED:
        print(f"job {info.job_id} to {address}: cancelled")
    elif info.state is JobState.ANSWERED:
        print(f"job {info.job_id} to {address}: answered before the cancel reached it")
        print(f"the answer is kept; fetch it: {get}")
    else:
        # Failed or expired meanwhile: it has stopped, though not because of this cancel.
        print(f"job {info.job_id} to {address}: {_state(info)} before it could be cancelled")
    return 0
