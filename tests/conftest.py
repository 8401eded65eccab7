"""Settings for the whole test tree."""

from __future__ import annotations

import os

from hypothesis import settings

from tests.hypothesis_profiles import default_profile

# ``--hypothesis-profile=NAME`` still wins: Hypothesis's plugin loads it after this file.
settings.load_profile(default_profile(os.environ))
