"""The radius rule and the admit rule are each written once, in ``teamtr.trust_region``.

``StageConfig`` checks its radius when it is built (finite and > 0, one per agent); the stage
loop, ``TrustRegion`` and ``check_backend`` apply the same ``check_radius`` and decide admission
with the same ``admitted``.
"""

from __future__ import annotations

import math
from dataclasses import replace

import numpy as np
import pytest
from toy_backend import ToySampler, ToyUpdater, toy_game

from teamtr import StageConfig, check_backend
from teamtr.config import DEFAULT_RADIUS
from teamtr.reports import AgentUpdate
from teamtr.stage import inside_radius
from teamtr.trust_region import (
    ADMIT_TOLERANCE,
    RADIUS_RULE,
    TrustRegion,
    admitted,
    check_radius,
    per_agent_radii,
    radius_error,
)

BAD_VALUES = [0.0, -0.1, math.nan, math.inf, -math.inf, True, "0.1", None]


@pytest.mark.parametrize("value", BAD_VALUES, ids=repr)
def test_stage_config_rejects_a_bad_shared_radius_naming_it(value):
    with pytest.raises(ValueError) as raised:
        StageConfig(radius=value)
    assert str(raised.value) == f"{RADIUS_RULE}, got {value!r}"


@pytest.mark.parametrize("value", BAD_VALUES, ids=repr)
def test_stage_config_names_the_agent_of_a_bad_per_agent_radius(value):
    with pytest.raises(ValueError) as raised:
        StageConfig(radius=(0.1, 0.2, value))
    assert str(raised.value) == f"{RADIUS_RULE}, got {value!r} for agent 2"


def test_stage_config_holds_floats_and_tuples_of_floats():
    assert StageConfig(radius=1).radius == 1.0 and isinstance(StageConfig(radius=1).radius, float)
    assert StageConfig(radius=[0.1, np.float64(0.2)]).radius == (0.1, 0.2)
    assert StageConfig(radius=np.array([0.1, 0.3])).radius == (0.1, 0.3)
    assert StageConfig().radius == DEFAULT_RADIUS
    with pytest.raises(ValueError, match="non-empty list"):
        StageConfig(radius=())


def test_the_count_of_per_agent_radii_is_checked_against_the_team():
    config = StageConfig(radius=(0.1, 0.2))
    assert config.radii(2) == (0.1, 0.2)
    assert StageConfig(radius=0.3).radii(3) == (0.3, 0.3, 0.3)
    for n_agents in (1, 3):
        with pytest.raises(ValueError) as raised:
            config.radii(n_agents)
        assert str(raised.value) == (
            f"radius must have one value per agent: 2 given for a team of {n_agents} agents"
        )


def test_every_core_entry_point_applies_the_same_rule():
    message = f"{RADIUS_RULE}, got 0.0"
    for build in (
        lambda: check_radius(0.0),
        lambda: TrustRegion(0.0),
        lambda: StageConfig(radius=0.0),
        lambda: check_backend(*_toy(), radius=0.0),
    ):
        with pytest.raises(ValueError) as raised:
            build()
        assert str(raised.value) == message
    assert radius_error(0.0) == message and radius_error(0.5) is None
    with pytest.raises(ValueError) as raised:
        per_agent_radii([0.1, 0.0], 2)
    assert str(raised.value) == f"{RADIUS_RULE}, got 0.0 for agent 1"


def _toy():
    game = toy_game()
    return game.uniform_team(), ToySampler(game), ToyUpdater()


def test_the_admit_rule_at_its_boundary():
    radius, tolerance = 0.01, 1e-6
    edge = radius * (1.0 + tolerance)
    assert admitted(edge, radius, tolerance)
    assert not admitted(float(np.nextafter(edge, math.inf)), radius, tolerance)
    assert admitted(radius, radius, 0.0)
    assert not admitted(float(np.nextafter(radius, math.inf)), radius, 0.0)
    for never in (math.nan, math.inf):
        assert not admitted(never, radius, tolerance)
    assert admitted(0.0, radius) and admitted(-1.0, radius)


def test_one_default_slack_for_the_stage_loop_and_trust_region():
    assert StageConfig().kl_tolerance == ADMIT_TOLERANCE == TrustRegion(0.01).tolerance
    edge = 0.01 * (1.0 + ADMIT_TOLERANCE)
    above = float(np.nextafter(edge, math.inf))
    assert admitted(edge, 0.01) and not admitted(above, 0.01)
    assert TrustRegion(0.01).admits(edge) and not TrustRegion(0.01).admits(above)


def test_the_stage_loop_keeps_an_update_exactly_when_it_is_admitted():
    update = AgentUpdate(policy=None, surrogate=0.1, kl=0.0, advantage_bound=1.0)
    tolerance = StageConfig().kl_tolerance
    edge = 0.01 * (1.0 + tolerance)
    for kl in (0.0, 0.01, edge, float(np.nextafter(edge, math.inf)), 0.02, math.nan):
        moved = replace(update, kl=kl)
        assert inside_radius(moved, 0.01, tolerance) == admitted(kl, 0.01, tolerance)
    assert not inside_radius(replace(update, kl=0.001, accepted=False), 0.01, tolerance)
