"""The card and `agentcall inspect` through real processes.

A real relay, ann (caller only) and ken (a listener with the fake agent) on their own HOMEs.
Ken's listener publishes his card when it starts; ann inspects ken before and after her first
call (inspecting pins nothing; the call does); ken offers a new task and his listener
publishes the changed card by itself; `doctor` reports a card that no longer matches.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tests.e2e.installs import Install, two_people

pytestmark = pytest.mark.e2e

# The listener looks for a changed card every 10 s (limits.CARD_CHECK_INTERVAL_S).
CHANGE_WAIT_S = 40.0


def inspect(ann: Install, target: str) -> dict[str, Any]:
    run = ann.cli("inspect", target, "--json")
    assert run.returncode == 0, run.stderr
    body: dict[str, Any] = json.loads(run.stdout)
    return body


def task_ids(body: dict[str, Any]) -> list[str]:
    return [task["id"] for task in body["card"]["tasks"]]


def offer_review(ken: Install) -> None:
    skill = ken.home / "AgentCall" / "tasks" / "review" / "SKILL.md"
    skill.parent.mkdir(parents=True, exist_ok=True)
    skill.write_text('---\ndescription: "Review a diff\\nin detail"\nname: Code review\n---\nGo.\n')
    offered = ken.cli("offer", "review")
    assert offered.returncode == 0, offered.stderr


def card_check(ken: Install) -> dict[str, Any]:
    report = json.loads(ken.cli("doctor", "--json").stdout)
    [check] = [c for c in report["checks"] if c["name"] == "card"]
    found: dict[str, Any] = check
    return found


def test_ann_inspects_ken_before_and_after_a_first_call_and_sees_his_card_change(
    tmp_path: Path,
) -> None:
    with two_people(tmp_path / "world") as world:
        ann, ken = world.ann, world.ken
        listener = ken.start_listener()
        listener.log.wait_for(r"card_published")

        before = inspect(ann, "@acme/ken")
        assert before["pin"] == "unseen" and before["fingerprint"]
        assert before["card_state"] == "unpinned" and task_ids(before) == ["ask"]
        assert before["card"]["agent_kind"] == "claude"
        assert before["presence"] == "undisclosed"
        assert before["next"] == 'agentcall call @acme/ken "hello"'
        assert inspect(ann, "@acme/ken")["pin"] == "unseen"  # inspecting pinned nothing
        text = ann.cli("inspect", "ken").stdout
        assert "presence: undisclosed" in text and "ask — Ask a question" in text

        assert ann.cli("call", "@acme/ken", "hello").returncode == 0  # the call pins ken
        after = inspect(ann, "@acme/ken")
        assert (after["pin"], after["card_state"], after["next"]) == ("pinned", "verified", None)
        assert after["fingerprint"] == before["fingerprint"] == after["pinned_fingerprint"]
        own = inspect(ken, "@acme/ken")
        assert (own["pin"], own["presence"], own["card_state"]) == ("own", "online", "verified")
        assert card_check(ken)["status"] == "pass", card_check(ken)

        # Ken offers a task: his listener notices and publishes the new card by itself.
        offer_review(ken)
        listener.log.wait_for(r"card_published tasks=2", CHANGE_WAIT_S)
        changed = inspect(ann, "@acme/ken")
        assert changed["card_state"] == "verified" and task_ids(changed) == ["ask", "review"]
        assert changed["card"]["tasks"][1] == {
            "id": "review",
            "name": "Code review",
            "summary": "Review a diff",
        }
        assert changed["card"]["issued_at"] > after["card"]["issued_at"]

        # With the listener stopped, a change is not published: doctor says so, and
        # `card --publish` puts it right.
        ken.stop()
        assert ken.cli("unoffer", "review").returncode == 0
        drift = card_check(ken)
        assert drift["status"] == "warn"
        assert "task review on the published card but no longer offered" in drift["detail"]
        published = ken.cli("card", "--publish")
        assert published.returncode == 0, published.stderr
        assert card_check(ken)["status"] == "pass"
        assert task_ids(inspect(ann, "@acme/ken")) == ["ask"]
