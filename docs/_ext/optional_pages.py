"""Toctree entries for pages that may not exist yet, dropped while they are absent.

The index names every guide in reading order. A few of them are written in parallel with the
site and land on their own; until a page's file exists, its entry is taken out of the index's
source as Sphinx reads it, so the build (warnings are errors) passes with or without it.
"""

from __future__ import annotations

from collections.abc import Collection


def drop_absent(source: str, optional: Collection[str], present: Collection[str]) -> str:
    """``source`` without the lines that are exactly an optional page's name (a toctree entry)
    when that page is not in ``present``; every other line as it was."""
    missing = set(optional) - set(present)
    kept = [line for line in source.splitlines(keepends=True) if line.strip() not in missing]
    return "".join(kept)
