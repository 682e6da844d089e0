"""Hypothesis settings profiles for the property tests of THEORY.md §2.

``HYPOTHESIS_PROFILE=quick`` (the default, used by ``make test``) keeps the whole directory
well under a minute and a half on two cores; ``HYPOTHESIS_PROFILE=thorough`` (``make prove``)
draws thousands of instances per fact. Every instance is exact and small, so the deadline is
off: a slow example is a large instance, not a bug.
"""

from __future__ import annotations

import os

from hypothesis import HealthCheck, settings

_COMMON = settings(
    deadline=None,
    suppress_health_check=(HealthCheck.too_slow, HealthCheck.data_too_large),
    print_blob=True,
)

settings.register_profile("quick", _COMMON, max_examples=25)
settings.register_profile("thorough", _COMMON, max_examples=2000)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "quick"))
