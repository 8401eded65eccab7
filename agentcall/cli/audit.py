"""``agentcall audit export|hold``: an organisation admin reads the audit trail out and puts
people (or the whole organisation) under legal hold.

The export streams: each event is written out as it arrives from the relay, so an export of a
million rows needs no more memory than one. ``--output FILE`` writes to a temporary file next
to FILE and renames it into place only once the relay's end line has arrived and every event
is on disk: FILE is either the whole export or not there (an older FILE stays as it was).
Without ``--output`` the events go to stdout as they come; an export cut short there exits
non-zero and says so on stderr, since what was printed is not the whole export.

Dates are UTC: ``2026-01-31`` or ``2026-01-31T12:00[:SS][Z|+00:00]``. ``--since`` counts from
that instant; ``--until`` stops before it, except that a bare date includes that whole day.
"""

from __future__ import annotations

import argparse
import re
from typing import IO, TYPE_CHECKING, Any

if TYPE_CHECKING:
    from agentcall.wire.http import AuditEvent, AuditHold

DESCRIPTION = """\
Export the organisation's audit trail, or put a legal hold on it (organisation admins only).
An export is metadata only (who did what to whom, and when), never message content. The relay
keeps audit rows for its retention period (an operator's option, 365 days by default); rows a
legal hold covers are kept until the hold is cleared."""

EPILOG = """\
examples:
  agentcall audit export --since 2026-01-01 --output audit.ndjson
  agentcall audit export --since 2026-03-01T00:00Z --until 2026-04-01 --format csv
  agentcall audit hold set ken --note "case 2026-14"   # keep everything naming ken
  agentcall audit hold set --org                      # keep everything of the organisation
  agentcall audit hold list
  agentcall audit hold clear ken"""

# Columns of both formats, in order.
COLUMNS = ("id", "at", "at_ms", "org", "event", "actor", "target", "call_id", "detail")

_DATE = re.compile(r"^(\d{4})-(\d{2})-(\d{2})\Z")
_DATETIME = re.compile(
    r"^(\d{4})-(\d{2})-(\d{2})[T ](\d{2}):(\d{2})(?::(\d{2}))?(Z|z|[+-]\d{2}:?\d{2})?\Z"
)
_UTC_OFFSETS = {"Z", "z", "+00:00", "+0000", "-00:00", "-0000"}
_DAY_S = 86_400


def parse_when(text: str, *, end_of_day: bool = False) -> int:
    """Whole seconds since the epoch for an ISO date or date and time in UTC.

    A bare date is its midnight, or with ``end_of_day`` the next midnight (so ``--until`` of
    a date includes that day). A time without an offset is UTC; an offset other than UTC's, or
    anything that is no ISO date, is refused with the forms that are accepted.
    """
    import calendar
    import datetime

    accepted = "give a UTC date as YYYY-MM-DD or a time as YYYY-MM-DDTHH:MM[:SS][Z]"
    date = _DATE.match(text)
    when = _DATETIME.match(text)
    try:
        if date:
            day = datetime.date(int(date[1]), int(date[2]), int(date[3]))
            seconds = calendar.timegm(day.timetuple())
            return seconds + (_DAY_S if end_of_day else 0)
        if when:
            offset = when[7]
            if offset is not None and offset not in _UTC_OFFSETS:
                raise argparse.ArgumentTypeError(
                    f"{text!r}: the time must be in UTC (Z or +00:00), not {offset}"
                )
            moment = datetime.datetime(
                int(when[1]),
                int(when[2]),
                int(when[3]),
                int(when[4]),
                int(when[5]),
                int(when[6] or 0),
            )
            return calendar.timegm(moment.timetuple())
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a real date; {accepted}") from None
    raise argparse.ArgumentTypeError(f"{text!r} is not an ISO date; {accepted}")


def _since(text: str) -> int:
    return parse_when(text)


def _until(text: str) -> int:
    return parse_when(text, end_of_day=True)


def _handle(text: str) -> str:
    from agentcall.cli.members import _handle as member_handle

    return member_handle(text)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from agentcall.cli.main import add_subcommand

    sub = parser.add_subparsers(dest="audit_command", metavar="SUBCOMMAND", required=True)
    export = add_subcommand(
        sub,
        "export",
        "Write the organisation's audit events out, as NDJSON or CSV.",
        "Write every audit event of the organisation (metadata only) in id order, streamed "
        "as the relay sends it. Dates are UTC: --since counts from that instant, --until "
        "stops before it (a bare date includes that whole day). With --output the file "
        "appears only once the export is whole; on stdout, a non-zero exit means it is not.",
        "agentcall audit export --since 2026-01-01 --format csv --output audit.csv",
    )
    export.add_argument("--since", type=_since, metavar="DATE", help="from this UTC date/time")
    export.add_argument("--until", type=_until, metavar="DATE", help="up to this UTC date/time")
    export.add_argument(
        "--format", choices=["ndjson", "csv"], default="ndjson", help="default: ndjson"
    )
    export.add_argument(
        "--output", metavar="FILE", help="write here (whole or not at all) instead of stdout"
    )
    hold = add_subcommand(
        sub,
        "hold",
        "Set, clear or list legal holds.",
        "A legal hold keeps audit events from retention's pruning: on one handle (the events "
        "naming it, and the invites it created or redeemed) or on the whole organisation. "
        "Holds and their changes are audit events themselves.",
        "agentcall audit hold set ken --note 'case 2026-14'",
    )
    holds = hold.add_subparsers(dest="hold_command", metavar="ACTION", required=True)
    for name, summary in (
        ("set", "Put a handle, or the whole organisation, under legal hold."),
        ("clear", "Take a legal hold off."),
    ):
        action = add_subcommand(
            holds,
            name,
            summary,
            summary + " Give a HANDLE, or --org for the whole organisation.",
            f"agentcall audit hold {name} ken",
        )
        whom = action.add_mutually_exclusive_group(required=True)
        whom.add_argument(
            "handle", metavar="HANDLE", nargs="?", type=_handle, help="a handle or @org/handle"
        )
        whom.add_argument("--org", action="store_true", help="the whole organisation")
        if name == "set":
            action.add_argument("--note", help="a reference kept with the hold (a case number)")
        action.add_argument("--json", action="store_true", help="print one JSON object")
    listing = add_subcommand(
        holds, "list", "List the legal holds.", "List the legal holds that stand.",
        "agentcall audit hold list --json",
    )  # fmt: skip
    listing.add_argument("--json", action="store_true", help="print one JSON object")


# --- formats ------------------------------------------------------------------------------------


def _iso(at_ms: int) -> str:
    import datetime

    moment = datetime.datetime.fromtimestamp(at_ms / 1000, tz=datetime.UTC)
    return moment.strftime("%Y-%m-%dT%H:%M:%S.") + f"{at_ms % 1000:03d}Z"


def record(event: AuditEvent, org: str) -> dict[str, object]:
    """One event as both formats write it."""
    return {
        "id": event.id,
        "at": _iso(event.at_ms),
        "at_ms": event.at_ms,
        "org": org,
        "event": event.event,
        "actor": event.actor,
        "target": event.target,
        "call_id": event.call_id,
        "detail": event.detail,
    }


# A spreadsheet would run a cell starting with these as a formula; such a cell gets a leading
# apostrophe in CSV (the NDJSON is exact).
_FORMULA_START = ("=", "+", "-", "@", "\t", "\r")


def csv_cell(value: object) -> str:
    """A CSV cell a spreadsheet shows rather than runs, and a terminal shows rather than
    obeys (control and invisible characters become spaces; none belongs in audit metadata)."""
    from agentcall.safetext import safe_cell

    text = "" if value is None else str(value)
    if text.startswith(_FORMULA_START):
        text = "'" + text
    return safe_cell(text)


class Writer:
    """Writes events to ``out`` in ``fmt`` as they come (the CSV header first)."""

    def __init__(self, out: IO[str], fmt: str, org: str) -> None:
        import csv
        import json

        self._out = out
        self._org = org
        self._json = json
        self._csv = csv.writer(out, lineterminator="\n") if fmt == "csv" else None
        if self._csv is not None:
            self._csv.writerow(COLUMNS)
        self.events = 0

    def write(self, event: AuditEvent) -> None:
        row = record(event, self._org)
        if self._csv is not None:
            self._csv.writerow([csv_cell(row[column]) for column in COLUMNS])
        else:
            # Every non-ASCII and control character escaped: exact, and safe on a terminal.
            self._out.write(self._json.dumps(row, ensure_ascii=True) + "\n")
        self.events += 1


class PartialFile:
    """A file that appears at ``path`` only when :meth:`commit` is called: written to a
    temporary file beside it (0600), made durable, then renamed over ``path``. :meth:`discard`
    removes the temporary file, leaving ``path`` as it was."""

    def __init__(self, path: str) -> None:
        import os
        import tempfile

        directory = os.path.dirname(os.path.abspath(path))
        name = os.path.basename(path)
        fd, self.temp = tempfile.mkstemp(dir=directory, prefix=f".{name}.", suffix=".partial")
        self.path = path
        self.stream: IO[str] = os.fdopen(fd, "w", encoding="utf-8", newline="")

    def commit(self) -> None:
        import os

        from agentcall.atomicfile import fsync_directory

        self.stream.flush()
        os.fsync(self.stream.fileno())
        self.stream.close()
        os.replace(self.temp, self.path)
        fsync_directory(os.path.dirname(os.path.abspath(self.path)))

    def discard(self) -> None:
        import contextlib
        import os

        with contextlib.suppress(OSError):
            self.stream.close()
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.temp)


# --- running ------------------------------------------------------------------------------------


def _refusal(exc: Exception) -> str:
    from agentcall.cli.render import safe_cell
    from agentcall.errors import ApiError, ApiErrorCode

    if isinstance(exc, ApiError):
        if exc.code is ApiErrorCode.FORBIDDEN:
            return "only an organisation admin may read the audit trail or set legal holds"
        return f"the relay refused: {safe_cell(exc.message)} ({exc.code})"
    return f"cannot reach the relay: {exc}"


def _hold_line(hold: AuditHold) -> str:
    from agentcall.cli.call import when
    from agentcall.cli.render import safe_cell

    whom = "the whole organisation" if hold.handle is None else hold.handle
    note = f" ({safe_cell(hold.note)})" if hold.note else ""
    return f"{whom}: held since {when(hold.set_at)} by {hold.set_by}{note}"


def run(args: argparse.Namespace) -> int:
    from agentcall.cli.call import load_installation
    from agentcall.cli.main import CommandError

    _home, config = load_installation()
    if args.audit_command == "export":
        if args.since is not None and args.until is not None and args.since >= args.until:
            raise CommandError("--since must be before --until")
        return _export(args, config)
    if args.hold_command != "list" and args.handle is not None:
        from agentcall.cli.members import _own_handle

        args.handle = _own_handle(args.handle, config.org)
    return _hold(args, config)


def _export(args: argparse.Namespace, config: Any) -> int:
    import os
    import sys

    from agentcall.cli.call import relay_api, run_on_reactor
    from agentcall.cli.main import CommandError
    from agentcall.client.api import ExportIncomplete, RelayUnreachable
    from agentcall.errors import AgentCallError, ApiError

    partial: PartialFile | None = None
    if args.output:
        if os.path.isdir(args.output):
            raise CommandError(f"--output {args.output} is a directory; name a file")
        try:
            partial = PartialFile(args.output)
        except OSError as exc:
            raise CommandError(f"cannot write {args.output}: {exc.strerror}") from None
    out = partial.stream if partial is not None else sys.stdout
    writer = Writer(out, args.format, config.org)

    async def work(reactor: Any) -> Any:
        api = relay_api(reactor, config)
        return await api.export_audit(writer.write, since=args.since, until=args.until)

    try:
        try:
            run_on_reactor(work)
        except ExportIncomplete as exc:
            where = (
                f"nothing was written to {args.output}"
                if partial is not None
                else "what was printed is not the whole export"
            )
            raise CommandError(f"the export is incomplete ({exc}); {where}") from None
        except (ApiError, RelayUnreachable) as exc:
            raise CommandError(_refusal(exc)) from None
        except AgentCallError as exc:
            raise CommandError(str(exc)) from None
        except OSError as exc:
            if partial is None:
                raise  # stdout closed (main reports a closed pipe), or another stdout fault
            raise CommandError(f"cannot write {args.output}: {exc.strerror}") from None
        if partial is not None:
            try:
                partial.commit()
            except OSError as exc:
                raise CommandError(f"cannot write {args.output}: {exc.strerror}") from None
            partial = None
            print(f"exported {writer.events} events to {args.output}", file=sys.stderr)
        else:
            out.flush()
    finally:
        if partial is not None:
            partial.discard()
    return 0


def _hold(args: argparse.Namespace, config: Any) -> int:
    from agentcall import ids
    from agentcall.cli.call import relay_api, run_on_reactor
    from agentcall.cli.main import CommandError
    from agentcall.cli.render import safe_json
    from agentcall.client.api import RelayUnreachable
    from agentcall.errors import AgentCallError, ApiError, ApiErrorCode
    from agentcall.wire import codec

    command = args.hold_command
    handle = None if command == "list" or args.org else args.handle

    async def work(reactor: Any) -> Any:
        api = relay_api(reactor, config)
        if command == "set":
            return await api.set_hold(handle, args.note)
        if command == "clear":
            return await api.clear_hold(handle)
        return await api.list_holds()

    whom = "the organisation" if handle is None else ids.format_address(config.org, handle)
    try:
        answer = run_on_reactor(work)
    except ApiError as exc:
        if exc.code is ApiErrorCode.NOT_FOUND and command == "clear":
            raise CommandError(f"no legal hold on {whom}") from None
        raise CommandError(_refusal(exc)) from None
    except RelayUnreachable as exc:
        raise CommandError(_refusal(exc)) from None
    except AgentCallError as exc:
        raise CommandError(str(exc)) from None
    if args.json:
        print(safe_json(codec.converter.unstructure(answer)))
        return 0
    if command == "set":
        print(f"legal hold on {whom}: retention keeps its audit events until the hold is cleared")
        print(_hold_line(answer))
    elif command == "clear":
        print(f"cleared the legal hold on {whom}: its events age out with the retention period")
    elif not answer.holds:
        print("no legal holds")
    else:
        for hold in answer.holds:
            print(_hold_line(hold))
    return 0
