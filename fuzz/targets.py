"""The fuzz targets: what each parser is fed, which errors it may raise, what else must hold.

A target turns one input (bytes) into one call of a parser exactly as the product calls it. The
parser may refuse the input with its own error types (``allowed``); any other exception is a
finding. Inputs that decode must also survive a round trip through the product's own encoder,
where one exists: an object the decoder built but the encoder cannot reproduce is a bug too.

Targets that decode several shapes take the shape from the input's first byte, so one fuzzing
process covers them all and the fuzzer can move a deep input from one shape to another.

This module does no fuzzing itself and never imports atheris; ``fuzz/child.py`` drives it.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable, Collection, Sequence
from pathlib import Path
from typing import Any, Final

import attrs

from agentcall import limits
from agentcall.errors import MalformedFrame
from agentcall.listener import ceiling, policy, tasks
from agentcall.listener.policyfile import SchemaProblem, decode_json
from agentcall.wire import codec, frames, local
from fuzz import seeds

# What each receiver accepts, with the size limit it passes (see relay/protocol.py,
# listener/connection.py, client/ws.py); None is "any frame type", the codec's own default.
FRAME_RECEIVERS: Final[tuple[tuple[Collection[type[frames.Frame]] | None, int], ...]] = (
    (frames.FROM_CALLER, limits.MAX_REQUEST_FRAME_BYTES),
    (frames.FROM_LISTENER, limits.MAX_RESPONSE_FRAME_BYTES),
    (frames.TO_LISTENER, limits.MAX_TO_LISTENER_FRAME_BYTES),
    (frames.TO_CALLER, limits.MAX_FRAME_BYTES),
    (None, limits.MAX_FRAME_BYTES),
)
# The local socket's two ends (listener/localsocket.py, cli/viaservice.py).
LOCAL_RECEIVERS: Final[tuple[tuple[Collection[type[Any]], int], ...]] = (
    (local.TO_SERVICE, limits.MAX_LOCAL_REQUEST_BYTES),
    (local.FROM_SERVICE, limits.MAX_LOCAL_EVENT_BYTES),  # a thin `agentcall call`
    (local.FROM_SERVICE_JOBS, limits.MAX_LOCAL_EVENT_BYTES),  # a thin `agentcall jobs`
)
HTTP_BODIES: Final[tuple[type[Any], ...]] = tuple(seeds.http_bodies())
SEALED_PAYLOADS: Final[tuple[type[Any], ...]] = tuple(seeds.sealed_payloads())


class RoundTripMismatch(Exception):
    """A parsed value that does not come back equal from the product's own encoder."""


@attrs.frozen
class Target:
    name: str
    summary: str
    check: Callable[[bytes], None]
    allowed: tuple[type[Exception], ...]
    seeds: Callable[[], list[bytes]]


# --- wire ------------------------------------------------------------------------------------


def _tagged_checker(
    receivers: Sequence[tuple[Collection[type[Any]] | None, int]],
    decode: Callable[..., Any],
) -> Callable[[bytes], None]:
    """Feed one receiver (chosen by the first byte) and round-trip what it decoded."""

    def check(data: bytes) -> None:
        if not data:
            return
        accept, max_bytes = receivers[data[0] % len(receivers)]
        value = decode(data[1:], accept, max_bytes=max_bytes)
        encoded = codec.encode(value)
        # The size limit is the receiver's business; the round trip is about the value.
        if decode(encoded, accept, max_bytes=len(encoded)) != value:
            raise RoundTripMismatch(f"{type(value).__name__} changed in a round trip")

    return check


def _frame_seeds() -> list[bytes]:
    found = []
    for frame in seeds.all_frames():
        for index, (accept, _limit) in enumerate(FRAME_RECEIVERS):
            if accept is None or type(frame) in accept:
                found.append(bytes([index]) + seeds.wire_bytes(frame))
    return found


def _local_seeds() -> list[bytes]:
    return [
        bytes([index]) + seeds.wire_bytes(line)
        for line in seeds.local_lines()
        for index, (accept, _limit) in enumerate(LOCAL_RECEIVERS)
        if type(line) in accept
    ]


def _body_checker(classes: Sequence[type[Any]], max_bytes: int) -> Callable[[bytes], None]:
    def check(data: bytes) -> None:
        if not data:
            return
        cls = classes[data[0] % len(classes)]
        value = codec.decode(data[1:], cls, max_bytes=max_bytes)
        encoded = codec.encode(value)
        if codec.decode(encoded, cls, max_bytes=len(encoded)) != value:
            raise RoundTripMismatch(f"{cls.__name__} changed in a round trip")

    return check


def _body_seeds(
    classes: Sequence[type[Any]], examples: dict[type[Any], list[Any]]
) -> Callable[[], list[bytes]]:
    def build() -> list[bytes]:
        return [
            bytes([index]) + seeds.wire_bytes(value)
            for index, cls in enumerate(classes)
            for value in examples[cls]
        ]

    return build


# --- the owner's and the administrator's files -----------------------------------------------


def _check_policy(data: bytes) -> None:
    # load_policy without the file: the same size cap, decoder and validation, in that order.
    if len(data) > policy.MAX_POLICY_BYTES:
        return
    try:
        document = decode_json(data)
    except SchemaProblem as problem:
        raise policy.PolicyError("policy.json", str(problem)) from None
    parsed = policy.parse_policy(document, source="policy.json")
    # What save_policy writes must load back as the same policy.
    saved = json.dumps(policy.policy_to_json(parsed), indent=2).encode("utf-8")
    if policy.parse_policy(decode_json(saved), source="policy.json") != parsed:
        raise RoundTripMismatch("the policy changed in a save/load round trip")


def _check_ceiling(data: bytes) -> None:
    # load_ceiling after its ownership and mode checks: size cap, decoder, validation.
    if len(data) > ceiling.MAX_CEILING_BYTES:
        return
    try:
        document = decode_json(data)
    except SchemaProblem as problem:
        raise ceiling.CeilingError("ceiling.json", str(problem)) from None
    ceiling.parse_ceiling(document, source="ceiling.json")


def _json_seeds(documents: Callable[[], list[Any]]) -> Callable[[], list[bytes]]:
    def build() -> list[bytes]:
        return [
            seeds.json_bytes(document, indent=indent)
            for document in documents()
            for indent in (2, None)
        ]

    return build


# --- tasks -----------------------------------------------------------------------------------


def _skill_checker(workspace: Path) -> Callable[[bytes], None]:
    # A read root holding one real directory, so a workdir can resolve and be accepted.
    root = str(workspace)
    path = workspace / "fuzzed" / tasks.SKILL_FILE

    def check(data: bytes) -> None:
        # _read_skill's own checks come first: a file too big or not UTF-8 never gets parsed.
        if len(data) > tasks.MAX_SKILL_BYTES:
            return
        try:
            text = data.decode("utf-8")
        except UnicodeDecodeError:
            return
        tasks.parse_skill("fuzzed", text, path, [root])

    return check


def _skill_seeds(workspace: Path) -> Callable[[], list[bytes]]:
    def build() -> list[bytes]:
        return [text.encode("utf-8") for text in seeds.skill_texts(str(workspace / "work"))]

    return build


def build_targets(workspace: Path) -> dict[str, Target]:
    """Every target; ``workspace`` is a private scratch directory (the skill target's root)."""
    (workspace / "work").mkdir(exist_ok=True)
    found = [
        Target(
            "frames",
            "codec.decode_frame, as the relay, listener and caller each call it",
            _tagged_checker(FRAME_RECEIVERS, codec.decode_frame),
            (MalformedFrame,),
            _frame_seeds,
        ),
        Target(
            "local",
            "local.decode_line, as the service and the thin CLI each read the local socket",
            _tagged_checker(LOCAL_RECEIVERS, local.decode_line),
            (MalformedFrame,),
            _local_seeds,
        ),
        Target(
            "http",
            "codec.decode of every relay HTTP request and response body",
            _body_checker(HTTP_BODIES, limits.MAX_HTTP_BODY_BYTES),
            (MalformedFrame,),
            _body_seeds(HTTP_BODIES, seeds.http_bodies()),
        ),
        Target(
            "payloads",
            "codec.decode of the signed request/response plaintexts inside envelopes",
            _body_checker(SEALED_PAYLOADS, limits.MAX_REQUEST_CIPHERTEXT_BYTES),
            (MalformedFrame,),
            _body_seeds(SEALED_PAYLOADS, seeds.sealed_payloads()),
        ),
        Target(
            "skill",
            "tasks.parse_skill: a SKILL.md's fences, frontmatter (taskyaml) and fields",
            _skill_checker(workspace),
            (tasks._Bad,),
            _skill_seeds(workspace),
        ),
        Target(
            "policy",
            "policy.json bytes through decode_json and parse_policy, and a save round trip",
            _check_policy,
            (policy.PolicyError,),
            _json_seeds(seeds.policy_documents),
        ),
        Target(
            "ceiling",
            "the administrator ceiling's bytes through decode_json and parse_ceiling",
            _check_ceiling,
            (ceiling.CeilingError,),
            _json_seeds(seeds.ceiling_documents),
        ),
    ]
    return {target.name: target for target in found}


TARGET_NAMES: Final = ("frames", "local", "http", "payloads", "skill", "policy", "ceiling")


def run_one(target: Target, data: bytes) -> None:
    """Feed one input; an exception outside ``target.allowed`` is printed (hex) and re-raised.

    Re-raising lets libFuzzer stop and save the input under its ``-artifact_prefix``.
    """
    try:
        target.check(data)
    except target.allowed:
        return
    except Exception as failure:
        print(
            f"FINDING target={target.name} error={type(failure).__name__}\n"
            f"input ({len(data)} bytes, hex): {data.hex()}",
            file=sys.stderr,
            flush=True,
        )
        raise


def write_corpus(target: Target, corpus_dir: Path) -> int:
    """Write the target's seeds as one file each; returns how many."""
    corpus_dir.mkdir(parents=True, exist_ok=True)
    examples = target.seeds()
    for index, data in enumerate(examples):
        (corpus_dir / f"seed-{index:03d}").write_bytes(data)
    return len(examples)
