"""`--log-format json`: one JSON object per line, levels named, failures described."""

from __future__ import annotations

import io
import json

import pytest
from twisted.internet import protocol
from twisted.logger import LogLevel
from twisted.python import usage
from twisted.python.failure import Failure

from agentcall.compose import listen as listen_tap
from agentcall.logevents import JsonLinesObserver, Logger, json_line, use_log_format
from agentcall.relay import tap as relay_tap


def emitted(emit: object) -> list[dict[str, object]]:
    out = io.StringIO()
    log = Logger(namespace="agentcall.test", observer=JsonLinesObserver(out))
    emit(log)  # type: ignore[operator]
    return [json.loads(line) for line in out.getvalue().splitlines()]


def test_an_event_is_one_line_with_ts_level_event_then_its_fields() -> None:
    [line] = emitted(lambda log: log.warn("call_refused", call_id="c1", seconds=1.5, ok=True))
    assert list(line)[:3] == ["ts", "level", "event"]
    assert (line["level"], line["event"], line["call_id"], line["seconds"], line["ok"]) == (
        "warning",
        "call_refused",
        "c1",
        1.5,
        True,
    )
    assert str(line["ts"]).endswith("Z") and "T" in str(line["ts"])
    assert not [key for key in line if key.startswith("log_")]


def test_values_json_cannot_hold_are_their_repr_and_failures_are_described() -> None:
    def emit(log: Logger) -> None:
        try:
            raise ValueError("boom")
        except ValueError:
            log.failure("relay_listen_failed", failure=Failure(), where=("a", 1))

    [line] = emitted(emit)
    assert line["level"] == "critical" and line["where"] == "('a', 1)"
    assert line["failure"]["type"] == "ValueError"  # type: ignore[index]
    assert line["failure"]["message"] == "boom"  # type: ignore[index]
    assert "Traceback" in line["failure"]["traceback"]  # type: ignore[index]


def test_twisteds_own_events_are_their_text() -> None:
    event = {"log_format": "Site starting on {port}", "port": 8443, "log_level": LogLevel.info}
    line = json.loads(json_line(event))
    assert (line["event"], line["port"]) == ("Site starting on 8443", 8443)


@pytest.mark.parametrize("options_class", [relay_tap.Options, listen_tap.Options])
def test_the_daemons_ask_twistd_for_the_json_observer(
    options_class: type[usage.Options], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(protocol.Factory, "noisy", True)  # put back after: it is process-wide
    parent: dict[str, str] = {}
    options = options_class()
    options.parent = parent  # type: ignore[assignment]
    relay_args = ["--database", "x.sqlite", "--url", "https://relay.example"]
    extra = relay_args if options_class is relay_tap.Options else []
    options.parseOptions(["--log-format", "json", *extra])
    assert parent == {"logger": "agentcall.logevents.json_stdout_observer"}
    # Parsing options changes nothing process-wide; building the service quiets the factories.
    assert protocol.Factory.noisy is True
    with pytest.raises(usage.UsageError):
        options_class().parseOptions(["--log-format", "xml", *extra])


def test_text_stays_twistds_default(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(protocol.Factory, "noisy", True)
    parent: dict[str, str] = {}

    class Fake:
        pass

    fake = Fake()
    fake.parent = parent  # type: ignore[attr-defined]
    use_log_format(fake, "text")
    assert parent == {}
