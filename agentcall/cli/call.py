"""``agentcall call TARGET MESSAGE``: ask a coworker's agent, print its answer.

The answer goes to stdout, made terminal-safe (in ``--json`` too, even once decoded); the
lifecycle (ringing, answered, working, with elapsed time) goes to stderr as it happens. Exit 0
on an answer or a queued job, 1 on any failure with one line on stderr. ``--json`` prints
exactly one JSON object on stdout, also on failure.

When the callee has offline delivery on and is offline or busy, the relay keeps the call as a
mailbox job (unless ``--no-queue``): the job id and the command that fetches its answer
(``agentcall jobs get``, :mod:`agentcall.cli.jobs`) are printed instead of an answer.

An answer may open a conversation; ``--continue`` (or ``--context ID``) follows up on it, and
the open conversations are remembered in ``state.sqlite`` (:mod:`agentcall.caller.outbound`).

This module also holds what the other network commands share: running one piece of work on
the reactor, and loading the installation with errors worded for the CLI.
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import os
import sys
from collections.abc import Callable, Coroutine

from agentcall import ids, limits

# typing is for the type checker only: the thin path of `agentcall call` does not import it.
TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any, NoReturn, TypeVar

    from agentcall.caller.call import CallResult
    from agentcall.client.api import RelayApi
    from agentcall.local.config import Config
    from agentcall.local.home import Home
    from agentcall.wire.frames import CallStatus
    from agentcall.wire.local import LocalEnded

    T = TypeVar("T")

# Set by the listener in the environment of the agent answering a call.
NESTED_CALL_ENV = "AGENTCALL_CALL_ID"
MAX_TIMEOUT_S = limits.CLIENT_CALL_TIMEOUT_S
MAX_DETAIL_SHOWN = 300
_TTL_MIN = limits.CONTEXT_TTL_S / 60
_TURNS = limits.MAX_CONTEXT_TURNS
_TTL_H = limits.MAILBOX_TTL_S / 3600
# The --wait suggested for fetching a queued call's answer.
SUGGESTED_WAIT_S = 600
# The relay cannot take the call now (its storage is full or failing): sysexits' EX_UNAVAILABLE,
# apart from 1 so that a script can wait and try again instead of giving up.
EXIT_RELAY_UNAVAILABLE = 69
_RELAY_UNAVAILABLE_CODES = frozenset({"storage_full", "unavailable"})


def exit_status(code: str) -> int:
    """The exit status of a call that failed with ``code``."""
    return EXIT_RELAY_UNAVAILABLE if code in _RELAY_UNAVAILABLE_CODES else 1


DESCRIPTION = f"""\
Call a coworker's coding agent and print its answer.

TARGET is a contact name (see `agentcall contacts`), an address @org/handle in your own
organisation, or a bare handle in your organisation. MESSAGE is the question; several words
are joined with spaces, and `-` reads the message from stdin (at most 64,000 bytes of UTF-8).

The answer is printed on stdout; progress (ringing, answered, working, with elapsed time) on
stderr. The exit status is 0 when an answer came back and 1 otherwise, with a one-line reason;
{EXIT_RELAY_UNAVAILABLE} when the relay cannot take the call now because its storage is full or
failing (storage_full, unavailable): try again later. Calls cannot be placed from inside an
agent that is answering a call.

When the agent's owner has turned on offline delivery (`agentcall access --offline enabled`)
and their agent is offline or busy, the relay keeps your call for up to {_TTL_H:g} hours and
this command exits 0 at once, printing the job id and the command that fetches the answer
(`agentcall jobs get ADDRESS JOB_ID --wait 600`). `--no-queue` fails with offline or busy
instead, as calls to owners who have not opted in always do.

An answer may open a conversation (stderr then says so). For {_TTL_MIN:g} minutes after each
answer, and for up to {_TURNS} turns, `--continue` sends a follow-up that the agent answers
with the earlier turns in mind. With conversations open on several tasks of one agent, add
`--task` to pick one; `--context ID` names a conversation by the id `--json` printed.

When this installation's listener service runs (`agentcall listen`, or the service setup
installs), the call is handed to it over a private socket in the state directory and placed
from there, which starts faster; otherwise (caller-only installations, CI) this command dials
the relay itself. The output and exit status are the same either way. If the service stops
while it holds your call, this command exits 1 saying so. Ctrl-C hangs up either way."""

EPILOG = """\
examples:
  agentcall call @acme/ken "why does the nightly build fail on arm64?"
  agentcall call ken --task review -   < notes.md
  agentcall call ken "summarise the open TODOs" --json | jq -r .text
  agentcall call ken --continue "and on x86?"
  agentcall call ken --task review --continue "what about the tests?"
  agentcall call ken --context ctx_AbCdEfGhIjKlMnOpQrStUv "one more question" --json
  agentcall call ken "review the release notes when you are back" --json | jq -r .job_id
  agentcall call ken --no-queue "are you there right now?"""


def _task_id(text: str) -> str:
    if not ids.is_task_id(text):
        raise argparse.ArgumentTypeError(
            f"{text!r} is not a task id (lowercase letters, digits and '-', at most 64)"
        )
    return text


def _context_id(text: str) -> str:
    if ids.CONTEXT_ID_RE.match(text) is None:
        raise argparse.ArgumentTypeError(
            f"{text!r} is not a conversation id (ctx_ and 22 letters, digits, '-' or '_')"
        )
    return text


def _timeout(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds") from None
    if not 1 <= value <= MAX_TIMEOUT_S:
        raise argparse.ArgumentTypeError(f"the timeout must be 1..{MAX_TIMEOUT_S:g} seconds")
    return value


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("target", metavar="TARGET", help="contact name, @org/handle, or handle")
    parser.add_argument(
        "message", metavar="MESSAGE", nargs="+", help="the question; `-` reads it from stdin"
    )
    parser.add_argument(
        "--task", type=_task_id, metavar="ID", help="run one of the agent's named tasks"
    )
    thread = parser.add_mutually_exclusive_group()
    thread.add_argument(
        "--continue",
        dest="continue_",
        action="store_true",
        help="follow up on the open conversation with TARGET (with --task, that task's)",
    )
    thread.add_argument(
        "--context",
        type=_context_id,
        metavar="ID",
        help="follow up on the conversation with this id (as --json printed it)",
    )
    parser.add_argument(
        "--json",
        action="store_true",
        help="print one JSON object on stdout instead of text (with context_id when a "
        "conversation is open)",
    )
    parser.add_argument(
        "--no-queue",
        dest="queue",
        action="store_false",
        help="fail with offline or busy rather than let the relay keep the call as a job",
    )
    parser.add_argument(
        "--timeout",
        type=_timeout,
        default=MAX_TIMEOUT_S,
        metavar="SECONDS",
        help=f"give up after this long (default and maximum {MAX_TIMEOUT_S:g})",
    )


# --- shared by the network commands --------------------------------------------------------------


def run_on_reactor(work: Callable[[Any], Coroutine[Any, Any, T]]) -> T:
    """Run ``work(reactor)`` on the global reactor until it finishes; return or raise its result.

    Ctrl-C or SIGTERM cancels the work (a call in flight hangs up) and raises
    KeyboardInterrupt. The reactor runs once per process, which is all a command needs.
    """
    from agentcall.client.lean import without_collections

    with without_collections():
        from twisted.internet import defer, reactor, task

    outcome: list[tuple[bool, Any]] = []
    interrupted: list[bool] = []

    async def main(running: Any) -> None:
        pending = defer.ensureDeferred(work(running))

        def cancel() -> None:
            if not pending.called:
                # Whatever the cancelled work reports (often "cancelled" as a network
                # failure), the truth is that the person stopped it.
                interrupted.append(True)
                pending.cancel()

        running.addSystemEventTrigger("before", "shutdown", cancel)
        try:
            outcome.append((True, await pending))
        except BaseException as exc:  # handed back to the caller below, whatever it is
            outcome.append((False, exc))

    # react() always ends in sys.exit; the outcome recorded above is what counts.
    with contextlib.suppress(SystemExit):
        task.react(main, (), reactor)
    # The reactor runs once per process, so this process ends soon. At exit the interpreter
    # runs one last cyclic collection over everything Twisted, autobahn and the crypto
    # libraries built (~100 ms on the bench machine); frozen objects are not scanned, and
    # freeing them is left to the process's end.
    gc.freeze()
    if interrupted or not outcome:
        raise KeyboardInterrupt
    ok, value = outcome[0]
    if ok:
        result: T = value
        return result
    raise value


def relay_api(reactor: Any, config: Config) -> RelayApi:
    """The relay's HTTP API as this installation (tests replace this)."""
    from agentcall.client.api import Credentials, RelayApi

    credentials = Credentials(config.org, config.handle, config.token)
    return RelayApi(reactor, config.relay, credentials, config.ca_file)


def refuse_nested(report: Reporter) -> None:
    """Inside an agent answering a call, nothing may call out or fetch answers."""
    if NESTED_CALL_ENV in os.environ:
        report.fail(
            "nested_call",
            "nested calls are not supported: this agent is answering a call "
            f"({NESTED_CALL_ENV} is set), and may not place calls of its own",
        )


def when(timestamp: float) -> str:
    """A time for people: ``2025-06-15 09:30 UTC``."""
    import time

    return time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime(timestamp))


def load_installation() -> tuple[Home, Config]:
    """This installation's paths and config, or a CommandError saying what to do."""
    from agentcall.cli.main import CommandError
    from agentcall.local.config import load_config
    from agentcall.local.home import Home, LocalStateError

    try:
        home = Home.from_environ()
        return home, load_config(home)
    except LocalStateError as exc:
        raise CommandError(str(exc)) from None


# --- the call ------------------------------------------------------------------------------------


def _read_message(words: list[str]) -> bytes:
    if words == ["-"]:
        return sys.stdin.buffer.read(limits.MAX_MESSAGE_BYTES + 1)
    try:
        return " ".join(words).encode("utf-8")
    except UnicodeEncodeError:
        # Bytes that are not UTF-8 in argv arrive as lone surrogates.
        return b"\xff"


class Reporter:
    """Writes the outcome in the chosen form: text, or one JSON object.

    ``extra`` fields go into every JSON object it prints (``jobs get`` adds the job id and
    state to exactly the shape ``call`` prints).
    """

    def __init__(self, as_json: bool, extra: dict[str, object] | None = None) -> None:
        self.as_json = as_json
        self.address: str | None = None
        self.extra: dict[str, object] = dict(extra or {})

    def fail(
        self,
        code: str,
        message: str,
        call_id: str | None = None,
        *,
        exit_code: int | None = None,
        detail: str | None = None,
    ) -> NoReturn:
        """Say why the call failed and exit; ``detail``: the part of ``message`` the callee's
        side sent, also given on its own under ``--json`` so an agent can keep it apart."""
        from agentcall.cli.main import CommandError
        from agentcall.cli.render import safe_json

        if self.as_json:
            body: dict[str, object] = {
                "ok": False,
                "address": self.address,
                "code": code,
                "message": message,
            }
            if call_id is not None:
                body["call_id"] = call_id
            if detail:
                body["detail"] = detail
            body.update(self.extra)
            print(safe_json(body))
        raise CommandError(message, exit_status(code) if exit_code is None else exit_code)

    def result(self, result: CallResult, task: str | None, *, ended: bool = False) -> int:
        """Print ``result``; ``ended``: the conversation it continued is over (context_unknown)."""
        from agentcall.caller.callflow import ended_from_result

        return self.ended(ended_from_result(result, task, ended=ended))

    def ended(self, outcome: LocalEnded) -> int:
        """Print how a call ended (from either path: the service, or a direct call); exit 0 on
        an answer or a queued job, else CommandError with the one-line reason."""
        from agentcall.wire.local import EndKind

        self.address = outcome.address
        if outcome.conversation_note is not None:
            print(f"agentcall: {outcome.conversation_note}", file=sys.stderr, flush=True)
        if outcome.kind is EndKind.QUEUED:
            return self._queued(outcome)
        if outcome.kind is EndKind.ANSWER:
            return self._answer(outcome)
        if outcome.kind is EndKind.REFUSED:
            self.fail(str(outcome.code), str(outcome.message))
        self._failed(outcome)

    def _queued(self, outcome: LocalEnded) -> int:
        """A call the relay kept as a job: its id and how to fetch the answer; exit 0."""
        from agentcall.cli.render import safe_json

        if outcome.job_id is None or outcome.expires_at is None:
            raise ValueError("not a queued result")
        if self.as_json:
            body: dict[str, object] = {
                "ok": True,
                "queued": True,
                "job_id": outcome.job_id,
                "address": outcome.address,
                "expires_at": outcome.expires_at,
            }
            print(safe_json(body))
        else:
            print(f"queued as job {outcome.job_id} (kept until {when(outcome.expires_at)})")
            print(
                f"fetch the answer: agentcall jobs get {outcome.address} {outcome.job_id} "
                f"--wait {SUGGESTED_WAIT_S}"
            )
        print(
            f"agentcall: {outcome.address} is offline or busy; the relay keeps your call until "
            "their agent takes it",
            file=sys.stderr,
            flush=True,
        )
        return 0

    def _answer(self, outcome: LocalEnded) -> int:
        from agentcall.cli.render import safe_json, safe_text

        text = safe_text(outcome.text or "")
        if self.as_json:
            body: dict[str, object] = {
                "ok": True,
                "address": outcome.address,
                "call_id": outcome.call_id,
                # Cleaned here too, not only by the callee: `jq -r .text` prints the
                # decoded string raw, and the callee may be an older or hostile version.
                "text": text,
                "task": outcome.task,
            }
            if outcome.context_id is not None:
                body["context_id"] = outcome.context_id
            body.update(self.extra)
            print(safe_json(body))
        else:
            sys.stdout.write(text if text.endswith("\n") else text + "\n")
        return 0

    def _failed(self, outcome: LocalEnded) -> NoReturn:
        from agentcall.cli.render import describe_error, safe_cell
        from agentcall.errors import CallErrorCode

        code = CallErrorCode(str(outcome.code))
        message = describe_error(code)
        if outcome.ended:
            message = (
                f"That conversation with {outcome.address} has ended (it expired, reached its "
                "turn limit, or the agent no longer knows it); start a new call without "
                "--continue or --context."
            )
        detail = None
        if outcome.detail:
            detail = safe_cell(outcome.detail)
            if len(detail) > MAX_DETAIL_SHOWN:
                detail = detail[: MAX_DETAIL_SHOWN - 1] + "…"
            message += f" ({detail})"
        if outcome.offered:
            message += " Tasks offered to you: " + ", ".join(outcome.offered) + "."
        # The code too, so people can search for it and scripts can match it.
        message += f" [{code}]"
        self.fail(str(code), message, outcome.call_id, detail=detail)


class _Progress:
    """The lifecycle on one stderr line, extended as each state arrives.

    One line keeps a failing call's stderr to the progress and the reason, even when it is
    captured rather than shown on a terminal.
    """

    LABELS = {"ringing": "ringing…"}

    def __init__(self) -> None:
        self._open = False

    def state(self, state: str, elapsed_s: float) -> None:
        separator = "  " if self._open else ""
        label = self.LABELS.get(state, state)
        sys.stderr.write(f"{separator}{label} {elapsed_s:.1f}s")
        sys.stderr.flush()
        self._open = True

    def end(self) -> None:
        if self._open:
            sys.stderr.write("\n")
            sys.stderr.flush()
            self._open = False


def _message_or_fail(args: argparse.Namespace, report: Reporter) -> str:
    raw = _read_message(args.message)
    if len(raw) > limits.MAX_MESSAGE_BYTES:
        size = f"more than {limits.MAX_MESSAGE_BYTES}" if args.message == ["-"] else len(raw)
        report.fail(
            "message_too_large",
            f"the message is {size} bytes; the limit is {limits.MAX_MESSAGE_BYTES} bytes",
        )
    try:
        message = raw.decode("utf-8")
    except UnicodeDecodeError:
        report.fail("bad_request", "the message is not valid UTF-8 text")
    if not message.strip():
        report.fail("bad_request", "the message is empty")
    return message


def run(args: argparse.Namespace) -> int:
    from agentcall.client.lean import without_collections

    # One call per process, over in seconds, making nearly no garbage: the cyclic collector
    # would only scan the modules just imported, again and again (20-60 ms of a direct call;
    # one pass over Twisted's objects costs that). run_on_reactor freezes what is left.
    with without_collections():
        return _run(args)


def _run(args: argparse.Namespace) -> int:
    from agentcall.cli import viaservice
    from agentcall.wire.local import LocalCall

    report = Reporter(args.json)
    refuse_nested(report)
    message = _message_or_fail(args, report)
    progress = _Progress()

    def on_note(text: str) -> None:
        progress.end()
        print(f"agentcall: warning: {text}", file=sys.stderr, flush=True)

    try:
        request = LocalCall(
            target=args.target,
            message=message,
            task=args.task,
            continue_=args.continue_,
            context_id=args.context,
            queue=args.queue,
            timeout_ms=round(args.timeout * 1000),
        )
    except ValueError:
        # Nothing the service could take (a TARGET longer than any name): the direct path
        # words the refusal as it always has.
        request = None
    # Through the running service when there is one (no Twisted, no crypto in this process),
    # else dialling the relay from here.
    try:
        outcome = None if request is None else viaservice.call(request, progress.state, on_note)
        if outcome is None:
            outcome = _call_directly(args, message, report, progress.state, on_note)
    except viaservice.ServiceTrouble as exc:
        progress.end()
        report.fail(exc.code, str(exc))
    finally:
        progress.end()
    return report.ended(outcome)


def _keep_generated_code() -> None:
    """Before the wire classes are made: attrs' and cattrs' generated code comes from the
    installation's cache where it is there (see agentcall.client.codecache)."""
    from agentcall.client import codecache
    from agentcall.local.home import Home, LocalStateError

    try:
        state_dir = Home.from_environ().state_dir
    except LocalStateError:
        return  # the call itself says what is wrong with the installation
    codecache.install(state_dir)


def _call_directly(
    args: argparse.Namespace,
    message: str,
    report: Reporter,
    on_state: Callable[[str, float], None],
    on_note: Callable[[str], None],
) -> LocalEnded:
    """The call placed from this process: keys, the relay's API and a socket of its own."""
    from agentcall.client.lean import lean_imports

    # Before Twisted and autobahn are imported: what a one-call process never uses is not
    # loaded (see agentcall.client.lean).
    lean_imports()
    _keep_generated_code()
    from agentcall.caller import callflow
    from agentcall.cli.main import CommandError

    try:
        home, config = load_installation()
    except CommandError as exc:
        report.fail("not_set_up", str(exc))

    async def work(reactor: Any) -> LocalEnded:
        start = reactor.seconds()

        def on_status(frame: CallStatus) -> None:
            on_state(str(frame.state), reactor.seconds() - start)

        return await callflow.run_call(
            reactor,
            home,
            config,
            on_status,
            on_note,
            target=args.target,
            message=message,
            task=args.task,
            use_continue=args.continue_,
            context_id=args.context,
            queue=args.queue,
            timeout_s=args.timeout,
        )

    return run_on_reactor(work)
