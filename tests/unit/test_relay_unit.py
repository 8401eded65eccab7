"""The relay's systemd system unit: what it runs parses, and systemd rates it safe."""

from __future__ import annotations

import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from agentcall.relay.tap import Options

REPO = Path(__file__).resolve().parents[2]
UNIT = REPO / "packaging" / "systemd" / "agentcall-relay.service"
ENV = REPO / "packaging" / "systemd" / "relay.env"
EXPOSURE_AT_MOST = 2.0  # systemd's "OK"


def _env() -> dict[str, str]:
    values = {}
    for line in ENV.read_text().splitlines():
        if line.strip() and not line.startswith("#"):
            key, _, value = line.partition("=")
            values[key] = value
    return values


def _exec_start() -> str:
    [line] = [ln for ln in UNIT.read_text().splitlines() if ln.startswith("ExecStart=")]
    return line.removeprefix("ExecStart=")


def test_every_variable_the_unit_uses_is_set_in_the_example_environment() -> None:
    used = set(re.findall(r"\$\{?([A-Z_]+)\}?", _exec_start()))
    assert used and used <= set(_env())


def test_the_command_line_the_unit_runs_is_one_the_relay_accepts() -> None:
    """What systemd would run, with the example settings: twistd's plugin options parse."""
    env = _env()
    line = re.sub(r"\$\{([A-Z_]+)\}", lambda m: env[m.group(1)], _exec_start())
    words = [word for part in shlex.split(line) for word in (
        env[part[1:]].split() if part.startswith("$") else [part]
    )]  # fmt: skip
    plugin = words.index("agentcall-relay")
    assert words[:plugin] == ["/usr/bin/twistd", "-n", "--pidfile=", "--logfile=-"]
    options = Options()
    options.parseOptions(words[plugin + 1 :])
    assert options["database"] == env["AGENTCALL_RELAY_DATABASE"]
    assert "/run/credentials/agentcall-relay.service/key.pem" in options["listen"]


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("systemd-analyze") is None, reason="no systemd-analyze here")
def test_systemd_verifies_the_unit_and_rates_its_exposure_ok(tmp_path: Path) -> None:
    # verify checks that the program exists: point it at this environment's twistd.
    twistd = Path(sys.executable).with_name("twistd")
    unit = tmp_path / UNIT.name
    unit.write_text(UNIT.read_text().replace("/usr/bin/twistd", str(twistd)))
    verified = subprocess.run(
        ["systemd-analyze", "verify", str(unit)], capture_output=True, text=True, timeout=120
    )
    assert (verified.returncode, verified.stderr.strip(), verified.stdout.strip()) == (0, "", "")
    rated = subprocess.run(
        ["systemd-analyze", "security", "--offline=yes", str(unit)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    found = re.search(r"Overall exposure level for \S+: (\d+\.\d+)", rated.stdout)
    assert found is not None, rated.stdout + rated.stderr
    assert float(found.group(1)) <= EXPOSURE_AT_MOST, rated.stdout
