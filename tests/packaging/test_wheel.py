"""The built artifact: the wheel holds the plugin and no twisted/__init__.py, and works installed.

The installed check runs from a directory outside the checkout, in a fresh virtualenv whose only
project code comes from the wheel (dependencies are borrowed from the test environment by path,
so no network is needed).
"""

from __future__ import annotations

import os
import subprocess
import sys
import sysconfig
import venv
import zipfile
from pathlib import Path

import pytest

pytestmark = [pytest.mark.packaging, pytest.mark.slow]

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("dist")
    subprocess.run(
        [sys.executable, "-m", "build", "--wheel", "--no-isolation", "--outdir", str(out)],
        cwd=REPO,
        check=True,
        capture_output=True,
        timeout=300,
    )
    (built,) = out.glob("agentcall-*.whl")
    return built


def test_wheel_holds_the_plugin_and_no_twisted_package_marker(wheel: Path) -> None:
    """A twisted/__init__.py in our wheel would shadow Twisted itself when installed."""
    names = set(zipfile.ZipFile(wheel).namelist())
    assert "twisted/plugins/agentcall_plugins.py" in names
    assert "twisted/__init__.py" not in names
    assert "twisted/plugins/__init__.py" not in names
    assert not [n for n in names if n.endswith("dropin.cache")]
    assert "agentcall/db/schema/relay-v1.sql" in names
    assert not [n for n in names if n.startswith("tests/")]


def test_installed_wheel_runs_twistd_and_the_cli_from_outside_the_checkout(
    wheel: Path, tmp_path: Path
) -> None:
    """`twistd agentcall-relay --help` and `agentcall --version` work from the wheel alone."""
    target = tmp_path / "venv"
    venv.EnvBuilder(with_pip=False).create(target)
    python = target / "bin" / "python"
    site = subprocess.run(
        [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        check=True,
        capture_output=True,
        text=True,
    ).stdout.strip()
    # Borrow the dependencies (not our package: that comes from the wheel) by path.
    deps = sysconfig.get_paths()["purelib"]
    Path(site, "borrowed-deps.pth").write_text(deps + "\n")
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "--python",
            str(python),
            "install",
            "--no-deps",
            "--no-index",
            "--quiet",
            str(wheel),
        ],
        check=True,
        capture_output=True,
        timeout=120,
    )
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    outside = tmp_path / "elsewhere"
    outside.mkdir()
    where = subprocess.run(
        [
            str(python),
            "-c",
            "import agentcall, twisted.plugins.agentcall_plugins as p;"
            "print(agentcall.__file__); print(p.__file__)",
        ],
        cwd=outside,
        env=env,
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    assert str(REPO) not in where, "the package must come from the wheel, not the checkout"

    helped = subprocess.run(
        # Twisted's console scripts live in the borrowed environment; run twistd's entry point.
        [
            str(python),
            "-c",
            "import sys; from twisted.scripts.twistd import run;sys.argv[0] = 'twistd'; run()",
            "agentcall-relay",
            "--help",
        ],
        cwd=outside,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert helped.returncode == 0, helped.stderr
    assert "--database" in helped.stdout and "--listen" in helped.stdout
    version = subprocess.run(
        [str(target / "bin" / "agentcall"), "--version"],
        cwd=outside,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert version.returncode == 0 and version.stdout.startswith("agentcall ")
