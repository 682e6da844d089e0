"""Held-out turn credit of the running-sum chain: the share of turns that state the running
total, the chain's dense reward evaluated on held-out problems (``llm.evaluation.held_out_problems``)."""

from __future__ import annotations

import numpy as np
import pytest
from llm_test_support import SHORT_SYSTEM_PROMPT, make_team

from llm.common.settings import SamplerSettings
from llm.conversation.dialogue import ChatFormat
from llm.conversation.router import FixedOrder
from llm.evaluation.held_out_problems import evaluate_team_with_episodes
from llm.problems.builtin import running_sum_credits
from llm.problems.rewards import running_sum_reward
from llm.problems.task import Task
from llm.problems.tasks import Problem
from llm.sampling.sampler import DialogueSampler

N_AGENTS = 2


def chain_problems(rng: np.random.Generator, count: int) -> list[Problem]:
    """Two private numbers with a one-digit sum: a random character model states one now and
    then, so the credit is not always 0."""
    problems = []
    for _ in range(count):
        a, b = (int(x) for x in rng.integers(0, 5, size=2))
        problems.append(Problem(f"Keep the total of {a} and {b}.", str(a + b), values=(a, b)))
    return problems


@pytest.fixture
def parts(char_tokenizer):
    chat = ChatFormat.from_tokenizer(char_tokenizer, N_AGENTS, system_prompt=SHORT_SYSTEM_PROMPT)
    settings = SamplerSettings(
        prompts_per_batch=2, group_size=2, turns=2, max_new_tokens=2, temperature=2.0, seed=1
    )
    chain = Task(chain_problems, reward=running_sum_credits)
    sampler = DialogueSampler(chat, FixedOrder(N_AGENTS), chain, settings)
    return make_team(len(char_tokenizer), N_AGENTS), sampler, chat


def test_turn_credit_is_the_mean_running_sum_reward_of_the_held_out_dialogues(parts):
    team, sampler, chat = parts
    problems = chain_problems(np.random.default_rng(0), 12)
    samples = 16  # sampled at T = 2: some turns state a total, so the mean is not trivially 0
    evaluation = evaluate_team_with_episodes(team, sampler, problems, samples=samples)
    credits = np.array(
        [
            running_sum_reward(
                [chat.message_text(t) for t in e.turns],
                [t.agent for t in e.turns],
                e.problem.values,
            )
            for e in evaluation.episodes
        ]
    ).reshape(len(problems), samples)
    per_problem = credits.mean(axis=1)
    assert credits.max() > 0, "no turn stated a total: the comparison would be vacuous"
    assert evaluation.metrics["turn_credit"] == pytest.approx(per_problem.mean(), abs=1e-12)
    assert evaluation.metrics["turn_credit_standard_error"] == pytest.approx(
        per_problem.std() / np.sqrt(len(problems)), abs=1e-12
    )


def test_turn_credit_is_reported_only_for_the_chain(parts):
    team, chain_sampler, chat = parts
    final_only = [Problem("Say 3.", "3"), Problem("Say 4.", "4")]
    # The same dialogues, rewarded by their final answer (the default reward) alone.
    sampler = DialogueSampler(chat, chain_sampler.router, Task(final_only), chain_sampler.settings)
    metrics = evaluate_team_with_episodes(team, sampler, final_only).metrics
    assert "turn_credit" not in metrics and "turn_credit_standard_error" not in metrics
