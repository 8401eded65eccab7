"""A hostile answer, end to end: the agent answers with terminal escapes (OSC 52 clipboard
write, OSC 8 link, CSI, C1, CR, backspace, a bidi override). The real listener removes them
before sealing, so even a caller that prints the decoded text raw gets nothing a terminal would
act on; and the real CLI's `--json` text is clean once decoded."""

from __future__ import annotations

import json
import unicodedata
from collections.abc import Iterator

import pytest
import pytest_twisted

from agentcall.wire import frames, payloads
from tests.e2e.installs import World, two_people
from tests.e2e.parties import enrol

pytestmark = pytest.mark.e2e

HOSTILE_ANSWER = (
    "plain\x1b]52;c;cm0gLXJmIH4=\x07 \x1b]8;;https://evil.example\x1b\\docs\x1b]8;;\x1b\\ "
    "\x9b2J\x9d0;title\x9c\x1b[31mred\x1b[0m\rX\x08\u202eY\tend\n"
)
CLEAN_ANSWER = "plain docs redX  Y\tend\n"


def unsafe(text: str) -> list[str]:
    """Every control character but TAB and LF, and every bidi control, in ``text``."""
    return [
        char
        for char in text
        if (unicodedata.category(char) == "Cc" and char not in "\t\n")
        or unicodedata.bidirectional(char) in {"LRO", "RLO", "LRE", "RLE", "PDF"}
    ]


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> Iterator[World]:
    with two_people(tmp_path_factory.mktemp("safe-replies")) as world:
        world.ken.start_listener()
        world.ken.set_scenario({"name": "happy", "answer": HOSTILE_ANSWER})
        yield world


@pytest_twisted.ensureDeferred
async def test_the_listener_seals_only_clean_text(world: World) -> None:
    """A caller with no cleaning of its own (a raw protocol party) opens a clean answer."""
    raw = await enrol(world.relay.url, world.relay.ca_file, world.invite(), "rawcaller")
    await raw.publish_keys()
    ken = await raw.keys_of("ken")
    sealed, request = await raw.seal_to(ken, "say something nasty")
    terminal, _ = await raw.call("ken", sealed)
    assert isinstance(terminal, frames.CallOutcome)
    opened = raw.open_outcome_with(terminal, request, ken.identity.record.identity_pub)
    assert isinstance(opened.outcome, payloads.Reply)
    assert opened.outcome.text == CLEAN_ANSWER


def test_call_json_text_is_clean_once_decoded(world: World) -> None:
    """`agentcall call … --json | jq -r .text` prints no escape; neither does the text form."""
    done = world.ann.cli("call", "ken", "say something nasty", "--json")
    assert done.returncode == 0, done.stderr
    text = json.loads(done.stdout)["text"]
    assert unsafe(text) == []
    assert text == CLEAN_ANSWER
    shown = world.ann.cli("call", "ken", "say it again")
    assert shown.returncode == 0, shown.stderr
    assert unsafe(shown.stdout) == []
