"""``agentcall history``: the recent inbound calls (calls.log) and tool attempts (tools.log).

Both logs are JSON lines written by this installation's listener and tool guard. Only the
newest part of each file is read, and lines that do not parse (a torn last line, a hand edit)
are skipped, so a long-lived or damaged log never stops the command. Everything shown came
from callers or agents, so it is made terminal-safe before it is printed.
"""

from __future__ import annotations

import argparse
import json
import os
from typing import TYPE_CHECKING, Any, Final

if TYPE_CHECKING:
    from agentcall.listener.calllog import LoggedCall
    from agentcall.local.home import Home

DEFAULT_LIMIT: Final = 20
MAX_LIMIT: Final = 200
EXCERPT_SHOWN: Final = 80
# Besides non-ok statuses and flagged calls, these tool decisions count as flagged.
FLAGGED_DECISIONS: Final = frozenset({"deny", "flag"})
_TOOL_TEXT: Final = ("ts", "call_id", "decision")
_TOOL_OPTIONAL: Final = ("tool", "tool_use_id", "rule", "target", "command")

DESCRIPTION = f"""\
Show the recent calls your agent answered or refused (from calls.log: time, caller, task,
status, duration and a short redacted excerpt of the answer) and the recent tool attempts of
answering agents (from tools.log: time, call id, tool, the guard's decision and its rule).

--flagged keeps only what deserves a look: calls with a flag (blocked_caller_attempt,
unknown_task_request, guard_unwired, …) or a status other than ok, and tool attempts the
guard denied or flagged. --limit caps each list (1..{MAX_LIMIT}, default {DEFAULT_LIMIT}); the
newest entries are shown, oldest first."""

EPILOG = """\
examples:
  agentcall history
  agentcall history --flagged --limit 50
  agentcall history --json | jq '.calls[] | select(.status != "ok")'"""


def _limit(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
    if not 1 <= value <= MAX_LIMIT:
        raise argparse.ArgumentTypeError(f"the limit must be 1..{MAX_LIMIT}")
    return value


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--limit",
        type=_limit,
        default=DEFAULT_LIMIT,
        metavar="N",
        help=f"show at most N calls and N tool attempts (1..{MAX_LIMIT}, default {DEFAULT_LIMIT})",
    )
    parser.add_argument(
        "--flagged", action="store_true", help="only flagged or failed calls, denied tool uses"
    )
    parser.add_argument("--json", action="store_true", help="print one JSON object")


# --- reading -------------------------------------------------------------------------------------


def _tool_entry(raw: bytes) -> dict[str, Any] | None:
    try:
        item = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError):
        return None
    if not isinstance(item, dict) or not all(isinstance(item.get(k), str) for k in _TOOL_TEXT):
        return None
    entry = {key: item[key] for key in _TOOL_TEXT}
    for key in _TOOL_OPTIONAL:
        value = item.get(key)
        if value is None or isinstance(value, str):
            entry[key] = value
        else:
            return None
    return entry


def read_tools(path: str | os.PathLike[str]) -> list[dict[str, Any]]:
    """Every well-formed entry in the newest part of tools.log, oldest first."""
    from agentcall.listener.calllog import TAIL_SCAN_BYTES

    try:
        with open(path, "rb") as log:
            size = log.seek(0, os.SEEK_END)
            start = max(0, size - TAIL_SCAN_BYTES)
            log.seek(start)
            chunk = log.read(TAIL_SCAN_BYTES)
    except FileNotFoundError:
        return []
    lines = chunk.split(b"\n")
    if start > 0:
        lines = lines[1:]  # the scan began mid-line
    return [entry for entry in map(_tool_entry, lines) if entry is not None]


def _call_json(call: LoggedCall) -> dict[str, Any]:
    body: dict[str, Any] = {
        "ts": call.ts,
        "call_id": call.call_id,
        "caller": call.caller,
        "task": call.task,
        "status": call.status,
        "duration_ms": call.duration_ms,
        "excerpt": call.excerpt,
        "flags": list(call.flags),
    }
    if call.error is not None:
        body["error"] = call.error
    return body


def _flagged_tool(tool: dict[str, Any]) -> bool:
    from agentcall.listener.guardwire import PREFLIGHT_TOOL

    # The listener's own check that the guard refuses (before every Codex run) is denied by
    # design; it stays in the full listing but is no warning sign.
    return tool["decision"] in FLAGGED_DECISIONS and tool["tool"] != PREFLIGHT_TOOL


def collect(home: Home, limit: int, flagged: bool) -> dict[str, Any]:
    """The report as one JSON-ready value."""
    from agentcall.listener.calllog import read_tail

    # Everything in the scanned tail first: filtering before the cut keeps N flagged entries.
    calls = list(read_tail(home.calls_log_path, 1_000_000))
    tools = read_tools(home.tools_log_path)
    if flagged:
        calls = [call for call in calls if call.flags or call.status != "ok"]
        tools = [tool for tool in tools if _flagged_tool(tool)]
    return {
        "flagged": flagged,
        "limit": limit,
        "calls": [_call_json(call) for call in calls[-limit:]],
        "tools": tools[-limit:],
    }


# --- showing -------------------------------------------------------------------------------------


def _cut(text: str, width: int) -> str:
    return text if len(text) <= width else text[: width - 1] + "…"


def _duration(ms: int) -> str:
    return f"{ms / 1000:.1f}s"


def render(report: dict[str, Any]) -> str:
    from agentcall.cli.render import safe_cell

    what = "flagged " if report["flagged"] else ""
    lines = [f"{what}calls (newest last):"]
    for call in report["calls"]:
        cells = [call["ts"], call["caller"], call["task"] or "-", call["status"]]
        cells.append(_duration(call["duration_ms"]))
        if call["flags"]:
            cells.append("flags: " + ",".join(call["flags"]))
        text = call["error"] if call["status"] != "ok" and call.get("error") else call["excerpt"]
        if text:
            cells.append(json.dumps(_cut(safe_cell(text), EXCERPT_SHOWN), ensure_ascii=False))
        lines.append("  " + "  ".join(safe_cell(cell) for cell in cells))
    if not report["calls"]:
        lines.append("  none")
    lines.append(f"{what}tool attempts (newest last):")
    for tool in report["tools"]:
        cells = [tool["ts"], tool["call_id"], tool["tool"] or "?", tool["decision"]]
        cells.append(tool["rule"] or "-")
        target = tool.get("target") or tool.get("command")
        if target:
            cells.append(_cut(target, EXCERPT_SHOWN))
        lines.append("  " + "  ".join(safe_cell(cell) for cell in cells))
    if not report["tools"]:
        lines.append("  none")
    return "\n".join(lines)


def run(args: argparse.Namespace) -> int:
    from agentcall.cli.main import CommandError
    from agentcall.cli.owner import home_or_fail
    from agentcall.cli.render import safe_json

    home = home_or_fail()
    try:
        report = collect(home, args.limit, args.flagged)
    except OSError as exc:
        raise CommandError(f"cannot read the logs: {exc.strerror or exc}") from None
    print(safe_json(report) if args.json else render(report))
    return 0
