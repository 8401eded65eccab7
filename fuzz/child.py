"""One target under atheris, in its own process (libFuzzer exits the process when it is done).

Started by ``fuzz/run.py`` as::

    python -m fuzz.child TARGET WORKSPACE CORPUS_DIR [libFuzzer flags...]

Nothing from ``agentcall`` may be imported before :func:`main` runs: atheris instruments only
the modules imported inside ``instrument_imports``, and that instrumentation is the coverage
feedback that guides the fuzzer.
"""

from __future__ import annotations

import importlib
import sys
from pathlib import Path
from typing import Any

ATHERIS_MISSING = (
    "atheris is not installed in this environment. It is in the `test` extra for Linux x86_64 "
    "(the platform it publishes wheels for): run scripts/venv, or `.venv/bin/pip install atheris`."
)


def load_atheris() -> Any:
    try:
        return importlib.import_module("atheris")
    except ImportError as failure:
        raise SystemExit(f"fuzz: {ATHERIS_MISSING} ({failure})") from None


def main(argv: list[str]) -> None:
    if len(argv) < 4:
        raise SystemExit(__doc__)
    name, workspace, corpus = argv[1], Path(argv[2]), Path(argv[3])
    atheris = load_atheris()
    with atheris.instrument_imports(include=["agentcall"]):
        from fuzz import targets
    everything = targets.build_targets(workspace)
    if name not in everything:
        raise SystemExit(f"fuzz: unknown target {name!r} (known: {', '.join(everything)})")
    target = everything[name]
    targets.write_corpus(target, corpus)

    def one_input(data: bytes) -> None:
        targets.run_one(target, data)

    # libFuzzer reads the corpus directory first (every seed runs once), then mutates.
    atheris.Setup([argv[0], *argv[4:], str(corpus)], one_input)
    atheris.Fuzz()


if __name__ == "__main__":
    main(sys.argv)
