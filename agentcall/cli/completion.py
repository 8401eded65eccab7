"""``agentcall completion bash|zsh|fish``: print a completion script made from the parser."""

from __future__ import annotations

import argparse

DESCRIPTION = """\
Print the shell completion script for bash, zsh or fish. It is generated from agentcall's own
parser, so it always knows every command and option of this version."""

EPILOG = """\
examples:
  agentcall completion bash > ~/.local/share/bash-completion/completions/agentcall
  agentcall completion zsh > "${fpath[1]}/_agentcall"
  agentcall completion fish > ~/.config/fish/completions/agentcall.fish"""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("shell", choices=["bash", "zsh", "fish"], help="which shell")


def run(args: argparse.Namespace) -> int:
    from agentcall.cli.reference import completion

    print(completion(args.shell), end="")
    return 0
