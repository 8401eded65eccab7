"""The Debian package's pinned libraries (packaging/debian/requirements.txt) satisfy what
pyproject.toml asks for, so the package never carries an older library than AgentCall needs."""

from __future__ import annotations

import tomllib
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

REPO = Path(__file__).resolve().parents[2]


def pins() -> dict[str, Version]:
    pinned: dict[str, Version] = {}
    for line in (REPO / "packaging" / "debian" / "requirements.txt").read_text().splitlines():
        if line.strip() and not line.startswith("#"):
            name, _, version = line.partition("==")
            assert version, f"not an exact pin: {line!r}"
            assert canonicalize_name(name) not in pinned, f"pinned twice: {name}"
            pinned[canonicalize_name(name)] = Version(version)
    return pinned


def test_every_dependency_is_pinned_at_a_version_it_accepts() -> None:
    pinned = pins()
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    for text in project["dependencies"]:
        requirement = Requirement(text)
        name = canonicalize_name(requirement.name)
        assert name in pinned, f"{requirement.name} is not pinned for the Debian package"
        assert requirement.specifier.contains(pinned[name]), (text, str(pinned[name]))
