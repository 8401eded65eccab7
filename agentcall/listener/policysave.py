"""Saving the owner's ``policy.json``: validated first, then replaced atomically.

Kept apart from :mod:`agentcall.listener.policy` because validation runs the owner's assertions
(:func:`agentcall.listener.admission.check_assertions`), and admission itself reads policies:
here both can be imported without either importing the other.
"""

from __future__ import annotations

import json
import os

from agentcall.atomicfile import replace_file
from agentcall.listener.admission import check_assertions
from agentcall.listener.ceiling import Ceiling
from agentcall.listener.policy import Policy, PolicyError, parse_policy, policy_to_json
from agentcall.listener.tasks import TaskSet


def save_policy(
    path: str | os.PathLike[str],
    policy: Policy,
    *,
    tasks: TaskSet | None = None,
    ceiling: Ceiling | None = None,
) -> None:
    """Validate, then atomically replace ``policy.json`` with a 0600 file.

    Validation is the loader's own, plus every owner and admin assertion evaluated against the
    effective policy: ``tasks`` (the tasks on disk; without them only ``ask`` exists, so an
    assertion that accepts a real task fails) under ``ceiling`` (None: unmanaged). A policy
    that fails raises :class:`PolicyError` and the old file is left as it was.
    """
    name = os.fspath(path)
    document = policy_to_json(policy)
    # The same validator as load_policy: nothing is saved that could not be loaded again.
    if parse_policy(document, source=name) != policy:
        raise PolicyError(name, "does not survive a round trip; refusing to save it")
    failures = check_assertions(policy, ceiling, tasks if tasks is not None else TaskSet())
    if failures:
        raise PolicyError(name, f"{failures[0]} (refusing to save a policy that breaks it)")
    data = (json.dumps(document, indent=2, sort_keys=False) + "\n").encode("utf-8")
    replace_file(name, data)
