"""Recovery through real processes: a code issued on a terminal, redeemed on a fresh HOME.

ann (admin, caller) pinned ken; ken issues a recovery code (on a pseudo-terminal, as the command
insists), loses the machine, and reclaims @acme/ken elsewhere with it. ann's next call reaches
the new ken after one notice; bob, whose pin does not chain to the new key, is refused.
"""

from __future__ import annotations

import os
import pty
import re
import select
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.e2e.installs import EVENT_WAIT_S, Install, two_people

pytestmark = pytest.mark.e2e

CODE_RE = re.compile(r"ACR1(?:-[A-Z2-7]{1,5})+")


def _on_a_terminal(
    install: Install, args: list[str], *, answer: str | None = None
) -> tuple[int, str]:
    """Run the CLI with a pseudo-terminal as stdin and stdout; type ``answer`` at its prompt."""
    main, child = pty.openpty()
    process = subprocess.Popen(
        [sys.executable, "-m", "agentcall", *args],
        env=install.env(),
        stdin=child,
        stdout=child,
        stderr=child,
        cwd=install.root,
        close_fds=True,
    )
    os.close(child)
    seen = b""
    typed = answer is None
    deadline = time.monotonic() + EVENT_WAIT_S
    while time.monotonic() < deadline:
        ready, _, _ = select.select([main], [], [], 1.0)
        if ready:
            try:
                chunk = os.read(main, 4096)
            except OSError:  # the child closed the terminal: it has exited
                break
            if not chunk:
                break
            seen += chunk
        if not typed and b"recovery code:" in seen:
            os.write(main, (answer or "").encode() + b"\n")
            typed = True
        if process.poll() is not None and not ready:
            break
    os.close(main)
    return process.wait(timeout=60), seen.decode(errors="replace")


def test_a_recovered_identity_is_followed_by_callers_who_pinned_it(tmp_path: Path) -> None:
    with two_people(tmp_path / "world") as world:
        ken, ann = world.ken, world.ann
        old_listener = ken.start_listener()
        bob = Install("bob", tmp_path / "bob", world.relay.ca_file)
        bob.setup(world.invite(), "bob", "--caller-only")
        for caller in (ann, bob):
            assert caller.cli("call", "@acme/ken", "hello").returncode == 0  # both pin ken

        code, shown = _on_a_terminal(ken, ["recovery", "issue"])
        assert code == 0, shown
        [recovery_code] = CODE_RE.findall(shown)
        # Off a terminal it is refused, so a code never lands in a pipe or a log.
        piped = ken.cli("recovery", "issue")
        assert piped.returncode != 0 and "terminal" in piped.stderr
        assert recovery_code not in (ken.state_dir / "keys.json").read_text()

        # bob's pin is made not to chain: as if he had pinned some other key for ken.
        with sqlite3.connect(bob.state_dir / "state.sqlite") as db:
            db.execute(
                "UPDATE pins SET identity_pub = ? WHERE address = '@acme/ken'",
                ("A" * 42 + "E",),
            )

        # The laptop is lost; on a new machine, ken reclaims the address with the code.
        new_ken = Install("ken-new", tmp_path / "ken-new", world.relay.ca_file)
        new_ken.home.mkdir(parents=True)
        redeem_args = ["recovery", "redeem", "--relay", str(world.relay.url), "--org", "acme"]
        redeem_args += ["--handle", "ken", "--agent", "claude", "--skip-service", "--no-verify"]
        wrong, said = _on_a_terminal(new_ken, redeem_args, answer="ACR1-AAAAA-BBBBB")
        assert wrong != 0 and "recovery code" in said
        done, said = _on_a_terminal(new_ken, redeem_args, answer=recovery_code)
        assert done == 0, said
        assert recovery_code not in said

        # The old installation is cut off, says why once, and stops.
        old_listener.log.wait_for(r"listener_recovered_elsewhere")
        assert old_listener.process.wait(timeout=60) is not None
        new_ken.set_scenario("happy")
        new_ken.start_listener()
        try:
            first = ann.cli("call", "@acme/ken", "is it you?")
            assert first.returncode == 0, first.stderr
            assert first.stdout.strip() == "FAKE-AGENT-ANSWER: is it you?"
            assert "recovered their identity on" in first.stderr
            second = ann.cli("call", "@acme/ken", "and again?")
            assert second.returncode == 0 and "recovered" not in second.stderr  # told once
            refused = bob.cli("call", "@acme/ken", "hello?")
            assert refused.returncode != 0 and "changed" in refused.stderr
            # A used code is dead.
            spare = Install("ken-spare", tmp_path / "ken-spare", world.relay.ca_file)
            spare.home.mkdir(parents=True)
            again, said = _on_a_terminal(spare, redeem_args, answer=recovery_code)
            assert again != 0 and "refused the recovery" in said
        finally:
            new_ken.stop()
        with sqlite3.connect(world.relay.database) as db:
            events = [
                row[0]
                for row in db.execute(
                    "SELECT event FROM audit WHERE event LIKE 'recovery.%' ORDER BY id"
                )
            ]
        assert events == ["recovery.issue", "recovery.redeem"]
