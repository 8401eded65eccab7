#!/usr/bin/env python3
"""A tiny stand-in agent for the demo, used when no logged-in `claude` or `codex` is found.

It behaves like AgentCall's `command` agent kind expects: the prompt arrives on stdin, the answer
goes to stdout. It answers from what the prompt says, so the demo shows a real round trip.
"""

import os
import sys

prompt = sys.stdin.read()
divider = "\n<<CALLER-MESSAGE>>\n"
message = prompt.split(divider, 1)[1].strip() if divider in prompt else prompt.strip()
caller = next((line for line in prompt.splitlines() if "@" in line), "")
entries = sorted(os.listdir("."))[:5]
print("Hello from ken's demo agent (a small script standing in for Claude Code or Codex).")
print(f"You asked: {message!r}")
print(f"I am running in {os.getcwd()}; the first entries here are: {', '.join(entries)}.")
if caller:
    print(f"The listener told me who is calling: {caller.strip()[:120]}")
