"""How hard the property tests try: quick while developing, full strength in CI.

Two Hypothesis profiles, both without the per-example deadline:

- ``ci``: Hypothesis's default of 100 examples per test, what every property test ran before
  the profiles existed. Chosen when the ``CI`` environment variable is set (CI sets
  ``CI=true``) or with ``pytest --hypothesis-profile=ci``.
- ``dev``: a fifth of that, the default everywhere else, for a fast edit-test loop.

A test that names its own ``max_examples`` is not touched by a profile, so such tests write
``max_examples=examples(n)``: ``n`` under ``ci``, scaled like the profile elsewhere.
"""

from __future__ import annotations

from collections.abc import Mapping

from hypothesis import settings

CI_EXAMPLES = 100
DEV_EXAMPLES = CI_EXAMPLES // 5
# Below this a scaled-down property test stops finding much; tests asking for less keep theirs.
DEV_FLOOR = 10

# Hypothesis fails any example slower than 200 ms by default: on a loaded machine that is a
# wall-clock race, not a finding. Tests assert on behaviour; none may depend on speed.
settings.register_profile("agentcall", deadline=None)
settings.register_profile(
    "ci", parent=settings.get_profile("agentcall"), max_examples=CI_EXAMPLES, print_blob=True
)
settings.register_profile(
    "dev", parent=settings.get_profile("agentcall"), max_examples=DEV_EXAMPLES
)


def default_profile(environ: Mapping[str, str]) -> str:
    """``ci`` when the environment says this is a CI run, else ``dev``."""
    flag = environ.get("CI", "").strip().lower()
    return "ci" if flag not in ("", "0", "false", "no") else "dev"


def examples(n: int) -> int:
    """``n`` examples at CI strength, scaled with the loaded profile's ``max_examples``.

    Under ``dev`` that is a fifth of ``n`` but at least ``min(n, DEV_FLOOR)``; a profile
    stronger than ``ci`` scales ``n`` up. Call it in the ``@settings`` decorator, which runs
    when the test module is imported, after the profile has been chosen.
    """
    if n < 1:
        raise ValueError(f"examples() needs a positive count, got {n}")
    current = settings.default
    strength = current.max_examples if current is not None else CI_EXAMPLES
    scaled = n * strength // CI_EXAMPLES
    return max(scaled, min(n, DEV_FLOOR))
