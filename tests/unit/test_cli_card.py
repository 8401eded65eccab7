"""`agentcall card`: the address, agent and default menu callers meet, computed locally, and
`--publish` against a fake relay."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import attrs
import pytest
from twisted.internet import defer

from agentcall.cli import call as call_cli
from agentcall.cli import owner
from agentcall.cli.main import main
from agentcall.crypto.card import verify_card
from agentcall.errors import ApiError, ApiErrorCode
from agentcall.listener.card import CardOffer, sign_offer
from agentcall.listener.ceiling import TEST_OVERRIDE_ENV, Ceiling, load_ceiling
from agentcall.local.config import load_config, save_config
from agentcall.local.home import Home
from agentcall.local.keystore import load_keys
from agentcall.wire.http import SignedCardRecord
from tests.unit.cli_helpers import NOW, ORIGIN, install, isolate, run_with_clock

REVIEW = (
    'description: "Review a diff"\n'
    "name: Code review\n"
    "keywords: [review, diff]\n"
    "examples:\n"
    '  - "Review my change to parser.py"'
)


@attrs.define
class Machine:
    home: Path
    ceiling_path: Path

    @property
    def state(self) -> Home:
        return Home.from_environ({"HOME": str(self.home)})

    def task(self, task_id: str, front: str = "description: d") -> None:
        path = self.home / "AgentCall" / "tasks" / task_id / "SKILL.md"
        path.parent.mkdir(parents=True)
        path.write_text(f"---\n{front}\n---\nDo it.\n")

    def policy(self, document: dict[str, Any]) -> None:
        self.state.policy_path.write_text(json.dumps(document))
        self.state.policy_path.chmod(0o600)


@pytest.fixture
def machine(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Machine:
    home = isolate(monkeypatch, tmp_path)
    install(home)
    ceiling_path = tmp_path / "admin" / "policy.json"
    ceiling_path.parent.mkdir()

    def test_ceiling() -> Ceiling | None:
        environ = {TEST_OVERRIDE_ENV: str(ceiling_path)}
        return load_ceiling(environ=environ, allow_test_override=True)

    monkeypatch.setattr(owner, "load_admin_ceiling", test_ceiling)
    monkeypatch.setattr(owner, "ceiling_path", lambda: str(ceiling_path))
    return Machine(home, ceiling_path)


def card(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(["card", *argv])
    out, err = capsys.readouterr()
    return code, out, err


def test_default_card_offers_ask(machine: Machine, capsys: pytest.CaptureFixture[str]) -> None:
    """A fresh installation: its address, Claude, and the built-in ask; not published."""
    code, out, _err = card(capsys, "--json")
    body = json.loads(out)
    assert code == 0
    assert body["address"] == "@acme/ann" and body["agent_kind"] == "claude"
    assert [task["id"] for task in body["tasks"]] == ["ask"]
    assert body["published"] is False


def test_offered_tasks_show_their_summary_and_grants_do_not(
    machine: Machine, capsys: pytest.CaptureFixture[str]
) -> None:
    """Only the default offer is on the card, each task as id, name and the first line of its
    description; a task granted to one caller, or stopped by the admin ceiling, is not, and
    nothing else of a task (keywords, examples, tools, workdir) is either."""
    machine.task("review", REVIEW)
    machine.task("deploy")
    machine.task("secret")
    machine.policy(
        {
            "version": 2,
            "default_offer": ["ask", "review", "secret"],
            "callers": {"ana": {"grants": ["deploy"]}},
        }
    )
    machine.ceiling_path.write_text(json.dumps({"version": 1, "allowed_tasks": ["ask", "review"]}))
    machine.ceiling_path.chmod(0o644)
    code, out, _err = card(capsys, "--json")
    body = json.loads(out)
    assert [task["id"] for task in body["tasks"]] == ["ask", "review"]
    assert body["tasks"][1] == {"id": "review", "name": "Code review", "summary": "Review a diff"}
    for hidden in ("deploy", "secret", "ana", "parser.py", "keywords", "tools", "workdir"):
        assert hidden not in out
    code, out, _err = card(capsys)
    assert code == 0
    assert "  review — Code review" in out and "    Review a diff" in out
    assert "keywords" not in out and "parser.py" not in out
    assert "agentcall card --publish" in out.splitlines()[-1]


def test_blocked_by_default_offers_nothing(
    machine: Machine, capsys: pytest.CaptureFixture[str]
) -> None:
    machine.policy({"version": 2, "default_access": "blocked"})
    code, out, _err = card(capsys)
    assert code == 0 and "tasks: none" in out and "allowed individually" in out


def test_caller_only_answers_nothing(machine: Machine, capsys: pytest.CaptureFixture[str]) -> None:
    state = machine.state
    save_config(state, attrs.evolve(load_config(state), agent_kind=None))
    body = json.loads(card(capsys, "--json")[1])
    assert body["answers_calls"] is False and body["tasks"] == []
    assert "caller-only" in card(capsys)[1]


def test_not_set_up_or_broken_policy_is_one_line(
    machine: Machine, capsys: pytest.CaptureFixture[str]
) -> None:
    machine.state.policy_path.write_text("{")
    machine.state.policy_path.chmod(0o600)
    code, _out, err = card(capsys)
    assert code == 1 and "cannot show the card" in err and len(err.splitlines()) == 1
    machine.state.config_path.unlink()
    code, _out, err = card(capsys)
    assert code == 1 and "agentcall setup" in err


def test_hostile_task_text_is_made_terminal_safe(
    machine: Machine, capsys: pytest.CaptureFixture[str]
) -> None:
    machine.task("odd", 'description: "a\x1b]0;x\x07b\u202ec"')
    machine.policy({"version": 2, "default_offer": ["odd"]})
    out = card(capsys)[1]
    assert "    ab c" in out.splitlines()  # the whole OSC goes, payload included
    assert "\x1b" not in out and "\u202e" not in out


def test_help_names_publishing_and_inspect(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        main(["card", "--help"])
    out = " ".join(capsys.readouterr().out.split())
    assert exited.value.code == 0
    assert "--publish" in out and "agentcall inspect" in out
    assert "agentcall card --publish" in out.split("examples:")[1]


@attrs.define
class FakeApi:
    kept: SignedCardRecord | None = None
    sent: list[SignedCardRecord] = attrs.field(factory=list)
    failure: Exception | None = None

    def get_card(self, handle: str) -> defer.Deferred[SignedCardRecord]:
        assert handle == "ann"
        if self.kept is None:
            return defer.fail(ApiError(404, ApiErrorCode.NOT_FOUND, "no card"))
        return defer.succeed(self.kept)

    def put_card(self, card: SignedCardRecord) -> defer.Deferred[SignedCardRecord]:
        if self.failure is not None:
            return defer.fail(self.failure)
        self.sent.append(card)
        self.kept = card
        return defer.succeed(card)


@pytest.fixture
def relay(monkeypatch: pytest.MonkeyPatch, machine: Machine) -> FakeApi:
    fake = FakeApi()
    monkeypatch.setattr(call_cli, "relay_api", lambda _reactor, _config: fake)
    monkeypatch.setattr(call_cli, "run_on_reactor", run_with_clock)
    return fake


def test_publish_signs_the_card_and_sends_it_once(
    machine: Machine, relay: FakeApi, capsys: pytest.CaptureFixture[str]
) -> None:
    machine.task("review", REVIEW)
    machine.policy({"version": 2, "default_offer": ["ask", "review"]})
    code, out, _err = card(capsys, "--publish", "--json")
    assert code == 0
    body = json.loads(out)
    assert (body["published"], body["changed"]) == (True, True)
    [sent] = relay.sent
    keys = load_keys(machine.state)
    verify_card(
        sent, address="@acme/ann", relay_origin=ORIGIN, identity_pub=keys.identity.public_b64
    )
    assert [t.id for t in sent.record.tasks] == ["ask", "review"]
    # The same card again: nothing is sent.
    code, out, _err = card(capsys, "--publish")
    assert code == 0 and len(relay.sent) == 1 and "already has this card" in out
    # A change is published, dated after the kept card even when the clock is behind it.
    later = sign_offer(CardOffer(agent_kind=None), keys.identity, ORIGIN, "@acme/ann", NOW + 500)
    relay.kept = later
    machine.policy({"version": 2, "default_offer": ["ask"]})
    assert card(capsys, "--publish")[0] == 0
    assert len(relay.sent) == 2 and relay.sent[1].record.issued_at == int(NOW) + 501
    assert [t.id for t in relay.sent[1].record.tasks] == ["ask"]


def test_a_kept_card_that_does_not_verify_is_replaced(
    machine: Machine, relay: FakeApi, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    other = install(tmp_path / "other")[2]
    relay.kept = sign_offer(CardOffer(agent_kind=None), other.identity, ORIGIN, "@acme/ann", NOW)
    assert card(capsys, "--publish")[0] == 0
    assert len(relay.sent) == 1


def test_a_refused_publish_is_one_line(
    machine: Machine, relay: FakeApi, capsys: pytest.CaptureFixture[str]
) -> None:
    relay.failure = ApiError(409, ApiErrorCode.CARD_NOT_NEWER, "a card dated no later is refused")
    code, out, err = card(capsys, "--publish")
    assert (code, out) == (1, "")
    assert "cannot publish the card" in err and len(err.strip().splitlines()) == 1
