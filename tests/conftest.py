"""Settings for the whole test tree."""

from __future__ import annotations

from hypothesis import settings

# Hypothesis fails any example slower than 200 ms by default: on a loaded machine that is a
# wall-clock race, not a finding. Tests assert on behaviour; none may depend on speed.
settings.register_profile("agentcall", deadline=None)
settings.load_profile("agentcall")
