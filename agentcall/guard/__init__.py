"""The tool guard: the PreToolUse hook program that checks every tool call of an answer.

Kept free of imports: the hook starts once per tool call, so its start-up time is paid on
every action the answering agent takes.
"""
