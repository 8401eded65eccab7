"""No needless key fetches, through real processes: relay, ken's listener, ann's CLI.

The relay logs one ``keys_fetched`` line per ``GET /v1/keys/<handle>`` (who asked, for whom),
and the listener ``caller_keys_fetched`` when it had to fetch a caller's records; the tests
count those. Ken's keys really rotate: his epoch 1 is minted (by the keystore, before setup
publishes it) as if 24 days ago, so his listener's own start-up rotation mints and publishes
epoch 2 while ann still holds epoch 1.
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Iterator

import pytest

from agentcall.local.home import Home
from agentcall.local.keystore import create_keys, load_keys
from tests.e2e.installs import Install, World
from tests.e2e.processes import start_relay

pytestmark = pytest.mark.e2e

# The pipeline's steps (call_received with caller_keys_attached, call_rejected) are debug lines.
DEBUG = {"AGENTCALL_LOG_LEVEL": "debug"}

DAY = 86400


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> Iterator[World]:
    root = tmp_path_factory.mktemp("keys")
    relay, invites = start_relay(root / "relay")
    world = World(
        relay,
        root,
        Install("ann", root / "ann", relay.ca_file),
        Install("ken", root / "ken", relay.ca_file),
    )
    try:
        world.ann.setup(invites["acme"], "ann", "--caller-only")
        # Ken's first epoch, minted by the keystore as it would have been 24 days ago: under
        # a week of it is left, so his listener rotates when it starts. Setup publishes it.
        ken_home = Home.from_environ({"HOME": str(world.ken.home)})
        world.ken.home.mkdir(parents=True)
        create_keys(ken_home, relay.url.origin, "@acme/ken", time.time() - 24 * DAY)
        world.ken.setup(world.invite(), "ken", "--agent", "claude")
        world.ken.set_scenario("happy")
        yield world
    finally:
        world.ken.stop()
        relay.stop()


def fetches(world: World, asker: str, handle: str) -> int:
    pattern = re.compile(rf"keys_fetched org='acme' asker='{asker}' handle='{handle}'")
    return len(pattern.findall(world.relay.log.text()))


def ken_epochs(ken: Install) -> list[int]:
    keys = load_keys(Home.from_environ({"HOME": str(ken.home)}))
    return [entry.epoch for entry in keys.epochs]


def test_calls_fetch_keys_only_when_they_must_across_a_real_rotation(world: World) -> None:
    ann, ken = world.ann, world.ken
    assert ken_epochs(ken) == [1]

    # Ken is offline: the call fails, but ann fetched and kept his epoch-1 records.
    offline = ann.cli("call", "@acme/ken", "are you there?", "--no-queue")
    assert offline.returncode != 0
    assert "offline" in offline.stderr.lower()
    assert fetches(world, "ann", "ken") == 1

    # Ken's listener starts, rotates for real and publishes epoch 2; it keeps epoch 1.
    listener = ken.start_listener(**DEBUG)
    listener.log.wait_for(r"key_published epoch=2")
    assert ken_epochs(ken) == [1, 2]

    # Ann still holds epoch 1 (fetched minutes ago): no fetch; ken opens it with his kept
    # epoch 1, and the relay handed him ann's records, so he fetched nothing either.
    first = ann.cli("call", "@acme/ken", "first question")
    assert first.returncode == 0, first.stderr
    assert first.stdout.strip() == "FAKE-AGENT-ANSWER: first question"
    second = ann.cli("call", "@acme/ken", "second question")
    assert second.returncode == 0, second.stderr
    assert fetches(world, "ann", "ken") == 1
    assert fetches(world, "ken", "ann") == 0
    assert "caller_keys_fetched" not in listener.log.text()
    assert len(re.findall(r"call_received .*caller_keys_attached=True", listener.log.text())) == 2


def test_a_callee_that_dropped_the_callers_epoch_is_called_again_with_fresh_keys(
    world: World,
) -> None:
    """Ken's listener no longer holds epoch 1 (its retention is over, as the keystore would
    prune it): ann's request sealed to her kept epoch 1 is rejected, she fetches epoch 2 and
    sends the call again, once; it is answered."""
    ann, ken = world.ann, world.ken
    assert ken_epochs(ken) == [1, 2]
    ken.stop()
    keys_json = ken.state_dir / "keys.json"
    data = json.loads(keys_json.read_text())
    data["encryption"] = data["encryption"][1:]
    keys_json.write_text(json.dumps(data, indent=2) + "\n")
    keys_json.chmod(0o600)
    assert ken_epochs(ken) == [2]
    listener = ken.start_listener(**DEBUG)
    before = fetches(world, "ann", "ken")
    mark = listener.log.mark()

    done = ann.cli("call", "@acme/ken", "after the prune")
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "FAKE-AGENT-ANSWER: after the prune"
    listener.log.wait_for(r"call_rejected .*reason='unknown_recipient_key'", since=mark)
    assert fetches(world, "ann", "ken") == before + 1

    # The fresh records are kept: the next call goes straight through, with no fetch.
    again = ann.cli("call", "@acme/ken", "and once more")
    assert again.returncode == 0, again.stderr
    assert fetches(world, "ann", "ken") == before + 1
    assert fetches(world, "ken", "ann") == 0


def test_a_mailbox_job_is_delivered_with_the_callers_records(world: World) -> None:
    """Queued while rita was away; her listener runs it without fetching ann's keys."""
    rita = Install("rita", world.root / "rita", world.relay.ca_file)
    rita.setup(world.invite(), "rita", "--agent", "claude")
    rita.set_scenario("happy")
    assert rita.cli("access", "--offline", "enabled").returncode == 0
    queued = world.ann.cli("call", "@acme/rita", "while you were out", "--json")
    assert queued.returncode == 0, queued.stderr
    job_id = json.loads(queued.stdout)["job_id"]
    listener = rita.start_listener(**DEBUG)
    try:
        done = world.ann.cli("jobs", "get", "@acme/rita", job_id, "--wait", "120", "--json")
        assert done.returncode == 0, done.stderr
        assert json.loads(done.stdout)["text"] == "FAKE-AGENT-ANSWER: while you were out"
        assert re.search(r"call_received .*job=True caller_keys_attached=True", listener.log.text())
        assert "caller_keys_fetched" not in listener.log.text()
        assert fetches(world, "rita", "ann") == 0
    finally:
        rita.stop()
