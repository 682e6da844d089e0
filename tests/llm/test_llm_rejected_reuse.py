"""After an update the trust region rejects, the team is unchanged, so its rollouts are still
on-policy: TeamTR trains the next agent on them instead of sampling again (``RolloutSource``),
and that update is the very one the same rollouts give when reached directly."""

from __future__ import annotations

import torch
from llm_test_support import AlternatingRewards

import llm
from llm.update.outcome import Outcome
from teamtr import StageConfig, run_stage

TINY = {
    "source": "tiny",
    "n_agents": 3,
    "role_prompts": (),
    "prompts_per_batch": 2,
    "group_size": 2,
    "turns": 3,
    "max_new_tokens": 4,
    "learning_rate": 1e-2,
    "steps": 1,
    "max_backtracks": 1,
    "threads": 1,
}
REJECTING = 1e-12
"""A radius no step of learning rate 1e-2 (shrunk once) fits in: the update is rejected."""


class Counting:
    """Counts the sampler's calls."""

    def __init__(self, inner) -> None:
        self.inner = inner
        self.calls = 0

    def sample(self, team, *, previous=None, updated_agent=None):
        self.calls += 1
        return self.inner.sample(team, previous=previous, updated_agent=updated_agent)

    def importance_weighted(self, rollouts, team):
        return self.inner.importance_weighted(rollouts, team)


def test_a_rejected_update_hands_its_rollouts_to_the_next_agent():
    team, sampler, updater, penalty = llm.build_team(**TINY)
    counting = Counting(AlternatingRewards(sampler))
    config = StageConfig(scheme="teamtr", radius=(REJECTING, 0.5, 0.5), order=(0, 1, 2))
    report, _ = run_stage(team, counting, updater, config, penalty)
    first, second, third = report.records
    assert not first.kept and first.update.outcome is not Outcome.NO_SIGNAL
    # Agent 1 trains on agent 0's rollouts: the team is unchanged, they are still on-policy.
    assert second.rollouts is first.rollouts and second.fresh_rollouts is False
    assert second.base is team and second.kept
    # Agent 1 moved the team: agent 2 gets fresh rollouts (from agent 1's first turn on).
    assert third.fresh_rollouts and third.rollouts is not second.rollouts
    assert counting.calls == 2 and len(report.sampled_rollouts) == 2

    # The same rollouts reached directly (the same first draw, agent 1 alone) give agent 1 the
    # very same update: the rejected one left no trace in the backbone or the generators.
    team_direct, sampler_direct, updater_direct, _ = llm.build_team(**TINY)
    direct, _ = run_stage(
        team_direct,
        AlternatingRewards(sampler_direct),
        updater_direct,
        StageConfig(scheme="teamtr", radius=0.5, order=(1,)),
        penalty,
    )
    (only,) = direct.records
    assert [e.turns for e in only.rollouts.episodes] == [e.turns for e in second.rollouts.episodes]
    assert only.update.kl == second.update.kl
    ours, theirs = second.update.policy.tensors, only.update.policy.tensors
    assert ours.keys() == theirs.keys()
    assert all(torch.equal(ours[key], theirs[key]) for key in ours)
