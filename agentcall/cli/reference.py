"""The command line as data, and what is made from it: man pages and shell completions.

:func:`command_tree` walks the very parser ``agentcall`` runs with (every command, its
subcommands, options and positionals), so the man pages (:func:`man_pages`) and the bash, zsh
and fish completions (:func:`completion`) cannot drift from it: they are generated, never
written by hand. ``agentcall-relay(8)`` comes from the relay plugin's own option table.
"""

from __future__ import annotations

import argparse
import datetime
from collections.abc import Iterator, Sequence
from typing import Any

import attrs

from agentcall import __version__


@attrs.frozen
class Option:
    flags: tuple[str, ...]
    help: str
    metavar: str | None = None  # None: a flag that takes no value
    choices: tuple[str, ...] = ()


@attrs.frozen
class Command:
    path: tuple[str, ...]  # ("agentcall", "members", "remove")
    summary: str
    description: str
    options: tuple[Option, ...]
    positionals: tuple[Option, ...]
    subcommands: tuple[Command, ...] = ()

    @property
    def name(self) -> str:
        return " ".join(self.path)

    def walk(self) -> Iterator[Command]:
        yield self
        for sub in self.subcommands:
            yield from sub.walk()


def _text(value: object) -> str:
    return "" if value is None or value is argparse.SUPPRESS else " ".join(str(value).split())


def _tree(parser: argparse.ArgumentParser, path: tuple[str, ...], summary: str) -> Command:
    options: list[Option] = []
    positionals: list[Option] = []
    subs: list[Command] = []
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            helps = {choice.dest: choice.help for choice in action._choices_actions}
            for name, child in action.choices.items():
                subs.append(_tree(child, (*path, name), _text(helps.get(name))))
            continue
        if action.help is argparse.SUPPRESS:
            continue
        choices = tuple(str(c) for c in action.choices) if action.choices else ()
        takes = action.nargs != 0
        metavar = _text(action.metavar) or (action.dest.upper() if takes else "")
        entry = Option(
            flags=tuple(action.option_strings) or (action.dest,),
            help=_text(action.help),
            metavar=metavar if takes else None,
            choices=choices,
        )
        (options if action.option_strings else positionals).append(entry)
    return Command(
        path=path,
        summary=summary,
        description=_text(parser.description),
        options=tuple(options),
        positionals=tuple(positionals),
        subcommands=tuple(subs),
    )


def command_tree() -> Command:
    """Every command ``agentcall`` has, as its parser defines it."""
    from agentcall.cli.main import build_parser

    return _tree(build_parser(), ("agentcall",), "call a coworker's coding agent")


# --- man pages ----------------------------------------------------------------------------------


def _roff(text: str) -> str:
    escaped = text.replace("\\", "\\e").replace("-", "\\-")
    # groff reads ASCII; anything else is named by its code point (\[u2026] is an ellipsis).
    escaped = "".join(ch if ord(ch) < 128 else f"\\[u{ord(ch):04X}]" for ch in escaped)
    # A line starting with . or ' would be read as a request.
    return "\\&" + escaped if escaped.startswith((".", "'")) else escaped


def _usage(command: Command) -> str:
    parts = [f"\\fB{_roff(command.name)}\\fR"]
    if command.subcommands:
        parts.append("\\fISUBCOMMAND\\fR")
    parts += [f"[\\fI{_roff(p.flags[0].upper())}\\fR]" for p in command.positionals]
    if command.options:
        parts.append("[\\fIOPTIONS\\fR]")
    return " ".join(parts)


def _options_section(command: Command) -> list[str]:
    lines: list[str] = []
    for option in (*command.positionals, *command.options):
        flags = ", ".join(f"\\fB{_roff(flag)}\\fR" for flag in option.flags)
        value = f" \\fI{_roff(option.metavar)}\\fR" if option.metavar else ""
        lines += [".TP", flags + value, _roff(option.help or "")]
        if option.choices:
            lines.append("One of: " + ", ".join(_roff(c) for c in option.choices) + ".")
    return lines


def _page(title: str, section: str, name_line: str, body: list[str]) -> str:
    import os

    # Reproducible builds pin the date (https://reproducible-builds.org/specs/source-date-epoch/).
    epoch = os.environ.get("SOURCE_DATE_EPOCH", "")
    when = datetime.datetime.fromtimestamp(int(epoch), datetime.UTC) if epoch.isdigit() else None
    date = (when.date() if when else datetime.date.today()).isoformat()
    head = [
        f'.TH "{title.upper()}" "{section}" "{date}" "agentcall {__version__}" "AgentCall"',
        ".SH NAME",
        _roff(name_line),
    ]
    return "\n".join([*head, *body]) + "\n"


def man_pages() -> dict[str, str]:
    """``{file name: roff text}``: ``agentcall.1``, one ``agentcall-COMMAND.1`` per command
    (its subcommands in it), and ``agentcall-relay.8``."""
    tree = command_tree()
    pages: dict[str, str] = {}
    overview = [".SH SYNOPSIS", "\\fBagentcall\\fR \\fICOMMAND\\fR [\\fIOPTIONS\\fR]"]
    overview += [".SH DESCRIPTION", _roff(tree.description), ".SH COMMANDS"]
    for command in tree.subcommands:
        overview += [".TP", f"\\fB{_roff(command.path[-1])}\\fR", _roff(command.summary)]
        overview.append(f"See \\fBagentcall\\-{_roff(command.path[-1])}\\fR(1).")
    overview += [".SH SEE ALSO", "\\fBagentcall\\-relay\\fR(8)"]
    pages["agentcall.1"] = _page("agentcall", "1", "agentcall - " + tree.summary, overview)
    for command in tree.subcommands:
        body: list[str] = []
        for node in command.walk():
            body += [".SH " + _roff(node.name.upper()), _usage(node)]
            if node.description:
                body += [".PP", _roff(node.description)]
            body += _options_section(node)
        slug = "agentcall-" + command.path[-1]
        pages[slug + ".1"] = _page(slug, "1", f"{slug} - {command.summary}", body)
    pages["agentcall-relay.8"] = _relay_page()
    return pages


def _relay_page() -> str:
    from agentcall.relay.tap import Options

    options: Any = Options()
    body = [
        ".SH SYNOPSIS",
        "\\fBtwistd\\fR \\-n agentcall\\-relay \\fB\\-\\-database\\fR \\fIFILE\\fR "
        "\\fB\\-\\-listen\\fR \\fIENDPOINT\\fR \\fB\\-\\-url\\fR \\fIPUBLIC_URL\\fR "
        "[\\fIOPTIONS\\fR]",
        ".SH DESCRIPTION",
        _roff(" ".join(options.longdesc.split())),
        ".SH OPTIONS",
    ]
    for long, short, default, text in options.optParameters:
        flags = f"\\fB\\-\\-{_roff(long)}\\fR" + (f", \\fB\\-{short}\\fR" if short else "")
        shown = f" (default: {_roff(str(default))})" if default is not None else ""
        body += [".TP", flags + " \\fIVALUE\\fR", _roff(" ".join(text.split())) + shown]
    for long, short, text in options.optFlags:
        flags = f"\\fB\\-\\-{_roff(long)}\\fR" + (f", \\fB\\-{short}\\fR" if short else "")
        body += [".TP", flags, _roff(" ".join(text.split()))]
    body += [".SH SEE ALSO", "\\fBagentcall\\fR(1), \\fBsystemd.exec\\fR(5)"]
    return _page("agentcall-relay", "8", "agentcall-relay - the AgentCall relay", body)


# --- completions --------------------------------------------------------------------------------


def _words(command: Command) -> list[str]:
    return [
        *(s.path[-1] for s in command.subcommands),
        *(f for o in command.options for f in o.flags),
    ]


def completion(shell: str) -> str:
    """The completion script for ``shell`` (bash, zsh or fish)."""
    tree = command_tree()
    nodes = list(tree.walk())
    if shell in ("bash", "zsh"):
        cases = []
        for node in nodes:
            key = " ".join(node.path[1:])
            cases.append(f'        "{key}") words="{" ".join(_words(node))}" ;;')
        script = [
            "# agentcall completion (generated from its parser by `agentcall completion`)",
            "_agentcall() {",
            "    local cur path word i",
            '    cur="${COMP_WORDS[COMP_CWORD]}"',
            '    path=""',
            "    for ((i = 1; i < COMP_CWORD; i++)); do",
            '        word="${COMP_WORDS[i]}"',
            '        case "$word" in -*) ;; *) path="${path:+$path }$word" ;; esac',
            "    done",
            '    local words=""',
            '    case "$path" in',
            *cases,
            "    esac",
            '    COMPREPLY=($(compgen -W "$words" -- "$cur"))',
            "}",
            "complete -F _agentcall agentcall",
        ]
        if shell == "zsh":
            script.insert(1, "autoload -U +X bashcompinit && bashcompinit")
        return "\n".join(script) + "\n"
    if shell == "fish":
        lines = ["# agentcall completion (generated from its parser by `agentcall completion`)"]
        lines.append("complete -c agentcall -f")
        for node in nodes:
            if len(node.path) > 2:
                continue  # fish: commands and their subcommands, with each one's options
            if len(node.path) == 1:
                condition = "__fish_use_subcommand"
            else:
                condition = f"__fish_seen_subcommand_from {node.path[1]}"
            for sub in node.subcommands:
                summary = sub.summary.replace("'", "\\'")
                lines.append(
                    f"complete -c agentcall -n '{condition}' -a {sub.path[-1]} -d '{summary}'"
                )
            for option in node.options:
                for flag in option.flags:
                    if flag.startswith("--"):
                        text = option.help[:60].replace("'", "\\'")
                        lines.append(
                            f"complete -c agentcall -n '{condition}' -l {flag[2:]} -d '{text}'"
                        )
        return "\n".join(lines) + "\n"
    raise ValueError(f"no completion for {shell!r}: bash, zsh or fish")


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m agentcall.cli.reference man DIR``: write the man pages into DIR (packaging)."""
    import sys
    from pathlib import Path

    args = list(sys.argv[1:] if argv is None else argv)
    if len(args) != 2 or args[0] != "man":
        print("usage: python -m agentcall.cli.reference man DIR", file=sys.stderr)
        return 2
    out = Path(args[1])
    out.mkdir(parents=True, exist_ok=True)
    for name, text in man_pages().items():
        (out / name).write_text(text, encoding="utf-8")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
