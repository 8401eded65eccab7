"""The fuzz harness itself (fuzz/): seeds reach deep, targets cover every shape, findings show.

The fuzzing runs (atheris, in subprocesses) are in scripts/test; these tests need no atheris.
"""

from __future__ import annotations

import importlib.util
import inspect
from pathlib import Path

import attrs
import pytest

from agentcall.errors import MalformedFrame
from agentcall.wire import codec, frames, http, keyrecords, local, payloads
from fuzz import run, seeds, targets


@pytest.fixture
def built(tmp_path: Path) -> dict[str, targets.Target]:
    return targets.build_targets(tmp_path)


def test_the_runner_knows_every_target(built: dict[str, targets.Target]) -> None:
    assert tuple(built) == run.TARGET_NAMES


def test_every_seed_is_accepted_whole(built: dict[str, targets.Target]) -> None:
    """A seed that a parser refused would start the fuzzer at the surface, not deep inside."""
    for target in built.values():
        examples = target.seeds()
        assert len(examples) >= 2, target.name
        for data in examples:
            target.check(data)  # no error at all, not even an allowed one


def test_every_wire_shape_is_fuzzed() -> None:
    """A body or frame added to the wire modules without a seed here fails this test."""
    # The key records are defined in keyrecords and named in http too; both are bodies.
    bodies = {
        cls
        for _, cls in inspect.getmembers(http, inspect.isclass)
        if attrs.has(cls) and cls.__module__ in {http.__name__, keyrecords.__name__}
    }
    assert set(targets.HTTP_BODIES) == bodies
    assert {type(frame) for frame in seeds.all_frames()} == set(frames.FRAME_TYPES.values())
    assert {payloads.SignedRequest, payloads.SignedResponse} <= set(targets.SEALED_PAYLOADS)
    assert {type(line) for line in seeds.local_lines()} == set(local.LOCAL_TYPES.values())


def test_the_selector_byte_reaches_every_receiver_and_body(
    built: dict[str, targets.Target],
) -> None:
    frame_selectors = {data[0] for data in built["frames"].seeds()}
    assert frame_selectors == set(range(len(targets.FRAME_RECEIVERS)))
    assert {data[0] for data in built["http"].seeds()} == set(range(len(targets.HTTP_BODIES)))
    local_selectors = {data[0] for data in built["local"].seeds()}
    assert local_selectors == set(range(len(targets.LOCAL_RECEIVERS)))


def test_an_allowed_error_is_not_a_finding(built: dict[str, targets.Target]) -> None:
    target = built["frames"]
    with pytest.raises(MalformedFrame):
        target.check(b"\x00{}")
    targets.run_one(target, b"\x00{}")


def test_any_other_exception_is_printed_in_hex_and_raised(
    capsys: pytest.CaptureFixture[str],
) -> None:
    def broken(data: bytes) -> None:
        raise KeyError(data)

    target = targets.Target("demo", "demo", broken, (MalformedFrame,), list)
    with pytest.raises(KeyError):
        targets.run_one(target, b"\x01\xfe")
    printed = capsys.readouterr().err
    assert "FINDING target=demo error=KeyError" in printed
    assert "input (2 bytes, hex): 01fe" in printed


def test_a_value_that_changes_in_a_round_trip_is_a_finding(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The oracle compares decode(encode(x)) with x; a lossy encoder stands in for a bug."""
    data = b"\x00" + seeds.wire_bytes(frames.CancelCall(call_id=seeds.CALL_ID))
    other = seeds.wire_bytes(frames.CancelCall(call_id=seeds.CALL_ID.replace("0f", "1f")))
    monkeypatch.setattr(codec, "encode", lambda _value: other)
    with pytest.raises(targets.RoundTripMismatch):
        targets.build_targets(tmp_path)["frames"].check(data)


LIBFUZZER_OUTPUT = """\
INFO: Instrumenting agentcall.wire.codec
#7\tINITED cov: 133 ft: 195 corp: 3/541b exec/s: 0 rss: 50Mb
#2048\tNEW    cov: 150 ft: 300 corp: 20/2Kb lim: 4096 exec/s: 1024 rss: 50Mb
#100000\tDONE   cov: 163 ft: 472 corp: 55/8824b lim: 4096 exec/s: 92485 rss: 50Mb
Done 100000 runs in 11 second(s)
stat::number_of_executed_units: 100000
"""


def test_final_statistics_are_read_from_libfuzzer_output() -> None:
    assert run.parse_stats(LIBFUZZER_OUTPUT) == run.Stats(100000, 163, 472, 55, 0)
    crashed = LIBFUZZER_OUTPUT.replace("#100000\tDONE", "#100000\tpulse") + "FINDING target=x\n"
    assert run.parse_stats(crashed) == run.Stats(100000, 163, 472, 55, 1)
    assert run.parse_stats("") == run.Stats(0, 0, 0, 0, 0)


def test_libfuzzer_is_told_the_limits() -> None:
    flags = run.libfuzzer_flags(
        runs=0, seconds=3, max_len=100, timeout=5, artifact_prefix="/c/frames-"
    )
    assert flags == [
        "-runs=-1",
        "-max_total_time=3",
        "-max_len=100",
        "-timeout=5",
        "-artifact_prefix=/c/frames-",
        "-print_final_stats=1",
    ]


@pytest.mark.parametrize(
    "argv", [["--target", "http"], ["--runs", "-1"], ["--replay", "x", "--target", "all"]]
)
def test_a_run_without_bounds_or_a_bad_option_is_refused(argv: list[str]) -> None:
    with pytest.raises(SystemExit) as stopped:
        run.main(argv)
    assert stopped.value.code == 2


def test_replay_runs_a_saved_input_without_atheris(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    saved = tmp_path / "policy-crash"
    saved.write_bytes(b'{"version": ' + b"9" * 5000 + b"}")
    assert run.main(["--target", "policy", "--replay", str(saved)]) == 0
    assert "is handled by target policy" in capsys.readouterr().out


def test_without_atheris_the_run_fails_loudly(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """CI must never pass a fuzz step it could not run."""
    monkeypatch.setattr(importlib.util, "find_spec", lambda _name: None)
    assert run.main(["--target", "http", "--seconds", "1"]) == 2
    assert "atheris is not installed" in capsys.readouterr().err
