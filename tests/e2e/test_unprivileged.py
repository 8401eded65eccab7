"""The boundary's tests again, as an unprivileged user (the unprivileged tier).

CI runs as root, and root is not what an owner is: /proc, ptrace and namespace rules differ for
an ordinary user (root may read a non-dumpable process's files; an owner may signal his own
processes where nothing else stops it). So, run as root with AGENTCALL_UNPRIVILEGED_TIER=1
(.ci/run sets it), this test makes a system user, copies this checkout into its home, gives it
a virtualenv of Debian's own Python (the one the suite runs on may live under /root, which that
user cannot enter) and runs the boundary tests there as that user: the confinement units, the
service socket's checks, and the hostile agent end to end.

Run as an ordinary user, it skips: the suite itself is then the unprivileged run.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

from tests.e2e.processes import REPO

# network: the virtualenv is filled from PyPI.
pytestmark = [pytest.mark.e2e, pytest.mark.slow, pytest.mark.network]

TIER_ENV = "AGENTCALL_UNPRIVILEGED_TIER"
USER = "agentcall-ci"
HOME = Path("/var/lib/agentcall-ci")
SYSTEM_PYTHON = "/usr/bin/python3"
SUBSET = (
    "tests/unit/test_confine_isolation.py",
    "tests/unit/test_confine_landlock.py",
    "tests/unit/test_confine_rules.py",
    "tests/unit/test_runpeer.py",
    "tests/unit/test_listener_localsocket.py",
    "tests/e2e/test_agent_boundary.py",
    "tests/e2e/test_kernel_boundary.py",
)
# Bounds the installation and the run (each waits for a process to end, never a delay).
INSTALL_S = 900
RUN_S = 1200


def _skip_reason() -> str | None:
    if os.environ.get(TIER_ENV) != "1":
        return f"the unprivileged tier is opt-in ({TIER_ENV}=1)"
    if os.geteuid() != 0:
        return "already an unprivileged user: this whole run is the unprivileged tier"
    for tool in ("useradd", "runuser", "git"):
        if shutil.which(tool) is None:
            return f"the unprivileged tier needs {tool}"
    if not os.access(SYSTEM_PYTHON, os.X_OK):
        return f"the unprivileged tier needs {SYSTEM_PYTHON} (Debian's python3)"
    return None


def _as_user(*argv: str, timeout: float, cwd: Path) -> subprocess.CompletedProcess[str]:
    env = {
        "HOME": str(HOME),
        "PATH": "/usr/local/bin:/usr/bin:/bin",
        "LANG": "C.UTF-8",
        "PIP_CACHE_DIR": str(HOME / "pip-cache"),
        "PIP_DISABLE_PIP_VERSION_CHECK": "1",
    }
    return subprocess.run(
        ["runuser", "-u", USER, "--", "env", "-i", *(f"{k}={v}" for k, v in env.items()), *argv],
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
        cwd=cwd,
    )


def _make_user() -> None:
    known = subprocess.run(["id", "-u", USER], capture_output=True, text=True, check=False)
    if known.returncode != 0:
        subprocess.run(
            [
                *("useradd", "--system", "--create-home", "--home-dir", str(HOME)),
                *("--shell", "/usr/sbin/nologin", USER),
            ],
            check=True,
            capture_output=True,
        )
    HOME.mkdir(mode=0o700, exist_ok=True)
    shutil.chown(HOME, USER, USER)


def _copy_checkout(target: Path) -> None:
    """The files git knows of (tracked, and new ones it does not ignore), as they are now."""
    listed = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        cwd=REPO,
        capture_output=True,
        check=True,
    )
    if target.exists():
        shutil.rmtree(target)
    for name in filter(None, listed.stdout.decode().split("\0")):
        source = REPO / name
        if not source.is_file():
            continue  # listed but deleted in the working tree
        (target / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(source, target / name)
    subprocess.run(["chown", "-R", f"{USER}:{USER}", str(target)], check=True)


def test_the_boundary_tests_pass_as_an_unprivileged_user() -> None:
    reason = _skip_reason()
    if reason is not None:
        pytest.skip(reason)
    _make_user()
    checkout = HOME / "checkout"
    _copy_checkout(checkout)
    venv = HOME / "venv"
    python = venv / "bin" / "python"
    if not python.exists():
        made = _as_user(SYSTEM_PYTHON, "-m", "venv", str(venv), timeout=INSTALL_S, cwd=HOME)
        assert made.returncode == 0, made.stderr[-3000:]
    installed = _as_user(
        str(python),
        "-m",
        "pip",
        "install",
        "--quiet",
        "--config-settings",
        "editable_mode=compat",
        "-e",
        ".[test]",
        timeout=INSTALL_S,
        cwd=checkout,
    )
    assert installed.returncode == 0, installed.stdout[-3000:] + installed.stderr[-3000:]
    ran = _as_user(
        str(venv / "bin" / "pytest"),
        "-p",
        "no:cacheprovider",
        "-q",
        "-n",
        "0",
        "-rs",
        *SUBSET,
        timeout=RUN_S,
        cwd=checkout,
    )
    summary = ran.stdout[-4000:] + ran.stderr[-2000:]
    assert ran.returncode == 0, summary
    # It really ran the hostile agent and the isolation probes as that user, not skips.
    skipped = [line for line in ran.stdout.splitlines() if line.startswith("SKIPPED")]
    for must_run in ("test_agent_boundary.py", "test_confine_isolation.py"):
        assert not any(must_run in line for line in skipped), skipped
    assert " passed" in ran.stdout.splitlines()[-1], summary
