"""A sampler whose rollouts are graded 1, 0, 1, 0, ... (the benchmarks' common grading).

A random or untrained model rarely answers right, and a batch without a reward difference
costs teamtr no update; graded this way, every GRPO group of an even size holds both rewards,
so that every update a benchmark times does its whole work, whatever the model said.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import torch

from llm.logprobs.losses import group_normalised_advantages
from llm.sampling.rollouts import DialogueRollouts
from llm.sampling.sampler import DialogueSampler


def alternating(count: int) -> list[float]:
    """1, 0, 1, 0, ...: every group of an even size holds both rewards."""
    return [float(i % 2 == 0) for i in range(count)]


class AlternatingRewards(DialogueSampler):
    """The real rollouts of ``DialogueSampler``, graded ``alternating``."""

    def finish(self, team, episodes, generated, reused, started, **kwargs) -> DialogueRollouts:
        rollouts = super().finish(team, episodes, generated, reused, started, **kwargs)
        rewards = np.array(alternating(len(rollouts.episodes)))
        advantages = group_normalised_advantages(
            torch.tensor(rewards), self.settings.group_size, self.settings.a_max
        ).numpy()
        return dataclasses.replace(rollouts, rewards=rewards, advantages=advantages)
