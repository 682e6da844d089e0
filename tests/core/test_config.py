"""StageConfig rejects bad values with a message naming the field; the order is reproducible."""

import pytest

from teamtr import StageConfig, stage_order


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"scheme": "ppo"}, "scheme"),
        ({"radius": 0.0}, "radius"),
        ({"radius": -1.0}, "radius"),
        ({"radius": float("nan")}, "radius"),
        ({"radius": ()}, "radius"),
        ({"order": (0, 0, 1)}, "order"),
        ({"order": "sorted"}, "order"),
        ({"kl_tolerance": 1.5}, "kl_tolerance"),
        ({"penalty_form": "l2"}, "penalty_form"),
    ],
)
def test_bad_values_name_the_field(kwargs, field):
    with pytest.raises(ValueError, match=field):
        StageConfig(**kwargs)


def test_per_agent_radius_must_match_team_size():
    config = StageConfig(radius=(0.1, 0.2))
    assert config.radius_of(1, 2) == 0.2
    with pytest.raises(ValueError, match="3 agents"):
        config.radius_of(0, 3)


def test_random_order_is_a_seeded_permutation_per_stage():
    config = StageConfig(order="random", seed=7)
    orders = [stage_order(config, 6, s) for s in range(20)]
    assert all(sorted(o) == list(range(6)) for o in orders)
    assert orders == [stage_order(config, 6, s) for s in range(20)]
    assert len(set(orders)) > 1
    assert stage_order(StageConfig(), 4) == (0, 1, 2, 3)
    assert stage_order(StageConfig(order=(2, 0, 1)), 3) == (2, 0, 1)
