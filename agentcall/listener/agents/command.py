"""The ``command`` kind: any executable that reads the prompt on stdin and prints the answer.

Exit 0 means the whole of stdout is the answer (UTF-8, bad bytes replaced); anything else is
an ``agent_error``, whose detail (the exit status and the end of stderr) goes to the owner's
calls.log; the caller is told the exit status only. Such a command has no sessions and no tools
that AgentCall knows of, so it cannot resume a conversation.
"""

from __future__ import annotations

from agentcall.listener.agents.base import (
    AgentAnswer,
    AgentFailure,
    AgentParser,
    AgentSpec,
    FailureKind,
    Invocation,
    Outcome,
    detail_with_tail,
    encode_prompt,
)
from agentcall.listener.runner import RunResult


class CommandParser:
    """Nothing to parse line by line: the answer is all of stdout, known only at exit."""

    @property
    def done(self) -> bool:
        return False

    @property
    def session_id(self) -> str | None:
        return None

    @property
    def tool_use_ids(self) -> tuple[str, ...]:
        return ()

    def feed_line(self, line: bytes) -> None:
        return None


class CommandAdapter:
    """Run ``spec.binary`` with no arguments, the prompt on stdin."""

    kind = "command"

    def build(self, spec: AgentSpec, prompt: str) -> Invocation:
        if spec.resume_session is not None:
            raise ValueError("a command agent cannot resume a conversation")
        return Invocation(
            argv=(spec.binary,),
            env_additions=dict(spec.extra_env),
            stdin_bytes=encode_prompt(prompt),
            cwd=spec.workdir,
        )

    def new_parser(self) -> CommandParser:
        return CommandParser()

    def interpret(self, result: RunResult, parser: AgentParser) -> Outcome:
        if result.cancelled:
            return AgentFailure(FailureKind.CANCELLED, "the run was cancelled")
        if result.timed_out:
            return AgentFailure(FailureKind.TIMEOUT, "no answer before the kill timer")
        if result.stdout_truncated:
            return AgentFailure(FailureKind.OUTPUT_TOO_LARGE, "the command printed too much")
        if result.exit_code == 0:
            return AgentAnswer(result.stdout.decode("utf-8", "replace"), None, ())
        how = f"signal {result.signal}" if result.signal is not None else f"code {result.exit_code}"
        detail = detail_with_tail(f"command exited with {how}", result.stderr)
        return AgentFailure(FailureKind.AGENT_ERROR, detail)


ADAPTER = CommandAdapter()
