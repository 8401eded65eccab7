"""A stand-in for the listener service's local socket: a thread that answers thin clients."""

from __future__ import annotations

import contextlib
import socket
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path

from agentcall.local import servicekey
from agentcall.wire.local import encode_key_line


def service_key(socket_path: Path) -> str:
    """Write a service key beside the socket, as the service does when it starts."""
    return servicekey.make(socket_path.with_name("service.key"))


def serve_lines(listening: socket.socket, key: str, answer: Callable[[bytes], list[bytes]]) -> None:
    """Accept connections until ``listening`` is shut down; read each connection's key line
    (it must be ``key``: else the connection gets nothing at all), then its request line, and
    write back the lines ``answer`` gives for it (none: the connection closes saying nothing)."""
    while True:
        try:
            conn, _ = listening.accept()
        except OSError:
            return
        with conn:
            data = b""
            while data.count(b"\n") < 2:
                chunk = conn.recv(65536)
                if not chunk:
                    break
                data += chunk
            key_line, _, rest = data.partition(b"\n")
            if key_line + b"\n" != encode_key_line(key):
                continue
            for line in answer(rest.split(b"\n", 1)[0]):
                conn.sendall(line + b"\n")


# The packages the thin path must never load: the network stack and the crypto.
HEAVY = ("twisted", "autobahn", "nacl", "cryptography", "txaio", "OpenSSL", "pyhpke")
# What a thin `agentcall call` must not load either, though the service uses it: each costs
# that process milliseconds it does not have (its target is 100 ms with the call itself).
SLOW = (
    "attr",
    "attrs",
    "cattrs",
    "agentcall.wire.codec",
    "agentcall.wire.frames",
    "agentcall.wire.http",
    "secrets",
    "tempfile",
    "typing",
    "shutil",
)
# Runs `agentcall ARGS…` and, at exit, says on stderr which of them the process imported.
_PROBE = (
    "import atexit, sys\n"
    f"heavy = {HEAVY!r}\n"
    f"slow = {SLOW!r}\n"
    "atexit.register(lambda: print('IMPORTED=' + ','.join(sorted({m.split('.')[0] for m in "
    "sys.modules if m.split('.')[0] in heavy})), file=sys.stderr))\n"
    "atexit.register(lambda: print('LOADED=' + ','.join(sorted(m for m in sys.modules "
    "if m in slow)), file=sys.stderr))\n"
    "from agentcall.cli.main import main\n"
    "sys.exit(main(sys.argv[1:]))\n"
)


def run_probed(
    args: Sequence[str], env: Mapping[str, str], cwd: Path, timeout_s: float = 120
) -> subprocess.CompletedProcess[str]:
    """`agentcall ARGS…` as its own process, reporting what it imported (see :func:`imported`)."""
    return subprocess.run(
        [sys.executable, "-c", _PROBE, *args],
        env=dict(env),
        capture_output=True,
        text=True,
        timeout=timeout_s,
        check=False,
        cwd=cwd,
    )


def imported(done: subprocess.CompletedProcess[str]) -> set[str]:
    """Which of :data:`HEAVY` a :func:`run_probed` process had loaded when it exited."""
    line = [ln for ln in done.stderr.splitlines() if ln.startswith("IMPORTED=")][-1]
    return {name for name in line.removeprefix("IMPORTED=").split(",") if name}


def loaded(done: subprocess.CompletedProcess[str]) -> set[str]:
    """Which of :data:`SLOW` a :func:`run_probed` process had loaded when it exited."""
    line = [ln for ln in done.stderr.splitlines() if ln.startswith("LOADED=")][-1]
    return {name for name in line.removeprefix("LOADED=").split(",") if name}


@contextlib.contextmanager
def serving(listening: socket.socket, serve: Callable[[], None]) -> Iterator[None]:
    """Run ``serve`` on a thread while the block runs; then shut ``listening`` and join it."""
    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    try:
        yield
    finally:
        listening.shutdown(socket.SHUT_RDWR)
        listening.close()
        thread.join(timeout=10)
