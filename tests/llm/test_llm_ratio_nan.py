"""The pre-update ratio check refuses a NaN gap between the behaviour and the policy."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from llm_test_support import arithmetic_sampler, with_rewards, with_sampled_logps

from llm.logprobs.scoring import message_tokens
from llm.update.reference import RatioCheckError
from llm.update.updater import TrustRegionUpdater, UpdaterSettings


@pytest.mark.parametrize("where", [0, -1])  # the first token, or the last of a message
@pytest.mark.parametrize("source", ["scored", "sampled"])  # [sampler] behaviour_logps
def test_a_nan_behaviour_log_prob_is_refused(char_team, char_chat, where, source):
    torch.manual_seed(0)
    sampler = arithmetic_sampler(char_chat, behaviour_logps=source)
    rollouts = with_rewards(sampler.sample(char_team), [1.0, 0.0, 0.0, 1.0])
    updater = TrustRegionUpdater(char_chat, UpdaterSettings())
    updater._reference_pass(
        char_team, 0, rollouts, message_tokens(char_chat, rollouts.episodes, 0)
    )  # the honest log-probs pass
    if source == "scored":
        corrupted = [list(turns) for turns in rollouts.old_logps]
        poisoned = corrupted[0][0].clone()
        poisoned[where] = float("nan")
        corrupted[0][0] = poisoned
        bad = dataclasses.replace(rollouts, old_logps=tuple(tuple(t) for t in corrupted))
    else:
        poisoned = rollouts.episodes[0].turns[0].sampled_logps.clone()
        poisoned[where] = float("nan")
        bad = with_sampled_logps(rollouts, 0, 0, poisoned)
    with pytest.raises(RatioCheckError, match=r"= inf before the update \(ratio must be 1\)"):
        updater.update(char_team, 0, bad, radius=0.1)
