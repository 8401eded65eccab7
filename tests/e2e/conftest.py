"""Fixtures for the end-to-end suite: real relay processes on loopback with TLS."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.e2e.processes import RelayProcess, start_relay


@pytest.fixture(scope="module")
def relay(
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[tuple[RelayProcess, dict[str, str]]]:
    """One relay for a module, with organisations `acme` and `other`."""
    workdir: Path = tmp_path_factory.mktemp("relay")
    process, invites = start_relay(workdir, orgs=("acme", "other"))
    yield process, invites
    process.stop()
