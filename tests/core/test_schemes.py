"""The schemes are one table (``teamtr.schemes.SCHEMES``): every scheme a config may name has
its row, and the rows say what THEORY.md says of each."""

from __future__ import annotations

from typing import get_args

from teamtr.config import SchemeName
from teamtr.schemes import SCHEMES, RolloutSource


def test_every_scheme_a_config_names_has_one_row():
    assert sorted(SCHEMES) == sorted(get_args(SchemeName))
    assert all(name == row.name for name, row in SCHEMES.items())


def test_the_rows_say_where_rollouts_come_from_and_when_updates_enter():
    kinds = {name: (row.rollouts, row.simultaneous) for name, row in SCHEMES.items()}
    assert kinds == {
        "teamtr": ("intermediate", False),  # Thm 3.4: resample pi_hat^{i-1}
        "stale": ("stage_start", False),  # Thm 3.7: the pi_cur cache
        "joint": ("stage_start", True),  # every agent against pi_cur, swapped in at once
        "happo": ("reweighted", False),
    }


class CountingSampler:
    def __init__(self) -> None:
        self.calls: list[tuple] = []

    def sample(self, team, *, previous=None, updated_agent=None):
        self.calls.append((team, previous, updated_agent))
        return f"rollouts {len(self.calls)}"

    def importance_weighted(self, rollouts, team):
        return f"{rollouts} reweighted for {team}"


def test_a_rollout_source_follows_its_row():
    for name, expected in (
        ("teamtr", ["rollouts 1", "rollouts 2", "rollouts 2"]),
        ("stale", ["rollouts 1"] * 3),
        ("happo", ["rollouts 1", "rollouts 1 reweighted for b", "rollouts 1 reweighted for b"]),
    ):
        sampler = CountingSampler()
        source = RolloutSource(name, sampler)
        source.start("a")
        handed = [
            source.for_update("a", None).rollouts,
            source.for_update("b", 0).rollouts,  # agent 0 was kept: the team changed
            source.for_update("b", None).rollouts,  # the last update was not kept
        ]
        assert handed == expected, name
