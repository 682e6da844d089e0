"""The exact updater checks a radius by the core's one rule (``teamtr.trust_region``).

A stage's radii come checked from ``teamtr.StageConfig``; the exact updater, which a caller may
also give a radius directly, reports a bad one with the same ``check_radius`` message.
"""

from __future__ import annotations

import math

import pytest

import sim
from teamtr.trust_region import RADIUS_RULE


@pytest.mark.parametrize("value", [-1.0, math.nan, math.inf])
def test_the_exact_updater_reports_a_bad_radius_with_the_core_rule(value):
    mdp = sim.random_mdp(6, 2, 2, gamma=0.9, seed=0)
    team = sim.random_team(mdp, 0)
    rollouts = sim.ExactSampler(mdp).sample(team)
    with pytest.raises(ValueError) as raised:
        sim.ExactUpdater(mdp).update(team, 0, rollouts, value)
    assert str(raised.value) == f"{RADIUS_RULE}, got {value!r}"
    # Radius 0 is the region {pi} itself: the exact "no move", not an error.
    still = sim.ExactUpdater(mdp).update(team, 0, rollouts, 0.0)
    assert still.kl == 0.0 and (still.policy == team.table).all()
