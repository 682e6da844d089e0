"""Helpers shared by the llm tests: tiny randomly initialised Llama teams (no download, seconds to build)."""

from __future__ import annotations

import dataclasses

import numpy as np
import torch

from llm.agents import LoraBackbone, LoraSettings, LoraTeam
from llm.dialogue import ChatFormat
from llm.loading import tiny_llama
from llm.losses import group_normalised_advantages
from llm.router import FixedOrder
from llm.sampler import DialogueRollouts, DialogueSampler, SamplerSettings
from llm.tasks import ArithmeticSuite

SHORT_SYSTEM_PROMPT = "Solve."


def make_team(vocab_size: int, n_agents: int, seed: int = 0, rank: int = 4) -> LoraTeam:
    backbone = LoraBackbone.create(
        tiny_llama(vocab_size, seed=seed), n_agents, LoraSettings(rank=rank), seed=seed
    )
    return backbone.initial_team()


def perturb_agent(team: LoraTeam, agent: int, scale: float, seed: int) -> LoraTeam:
    """A team whose agent ``agent`` has random (non-zero) LoRA B matrices."""
    generator = torch.Generator().manual_seed(seed)
    tensors = {
        key: (torch.randn(value.shape, generator=generator) * scale if "lora_B" in key else value)
        for key, value in team.agent(agent).tensors.items()
    }
    from llm.agents import AdapterWeights

    return team.with_agent(agent, AdapterWeights(tensors))


def arithmetic_sampler(chat: ChatFormat, n_agents: int = 3, **overrides) -> DialogueSampler:
    suite = ArithmeticSuite(1)
    settings = SamplerSettings(
        **{"prompts_per_batch": 2, "group_size": 2, "turns": 3, "max_new_tokens": 6, **overrides}
    )
    return DialogueSampler(
        chat, FixedOrder(n_agents), lambda rng, n: suite.sample("train", n, rng), settings
    )


def with_rewards(rollouts: DialogueRollouts, rewards: list[float]) -> DialogueRollouts:
    """The same episodes graded differently: gives the updater a non-zero advantage signal."""
    r = np.asarray(rewards, dtype=float)
    advantages = group_normalised_advantages(
        torch.tensor(r), rollouts.settings.group_size, rollouts.settings.a_max
    ).numpy()
    return dataclasses.replace(rollouts, rewards=r, advantages=advantages)


class AlternatingRewards:
    """Wraps a sampler: its real rollouts graded 1, 0, 1, 0, ... so that every batch has reward
    variance (a tiny random model never solves a problem, and a batch without variance gives
    the updater no signal)."""

    def __init__(self, inner: DialogueSampler) -> None:
        self.inner = inner

    def sample(self, team, *, previous=None, updated_agent=None):
        rollouts = self.inner.sample(team, previous=previous, updated_agent=updated_agent)
        return with_rewards(rollouts, [float(i % 2 == 0) for i in range(len(rollouts.episodes))])

    def importance_weighted(self, rollouts, team):
        return self.inner.importance_weighted(rollouts, team)
