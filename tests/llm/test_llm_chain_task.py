"""The running-sum chain (``note_answer = "chain"``): problems, role prompts and the dense
reward that gives every speaker a share (``llm.problems.rewards.running_sum_reward``)."""

from __future__ import annotations

from fractions import Fraction

import numpy as np
import pytest

from llm.problems.builtin import private_notes_task, running_sum_credits
from llm.problems.private_notes import PrivateNotesSuite, chain_role_prompts, random_guess_floor
from llm.problems.rewards import running_sum_reward
from llm.problems.task import final_answer_reward


def test_a_chain_problem_carries_its_numbers_and_asks_for_their_sum():
    suite = PrivateNotesSuite(4, note_max=5, answer="chain")
    for problem in suite.sample("train", 20, np.random.default_rng(0)):
        assert len(problem.values) == 4 and all(1 <= v <= 5 for v in problem.values)
        assert problem.notes == tuple(f"Your private number is {v}." for v in problem.values)
        assert problem.answer == str(sum(problem.values))
        assert problem.template.startswith("chain.")
    # The chain's task rewards every turn; the other answers keep grading the final message.
    assert private_notes_task(4, 5, answer="chain", eval_size=4).reward is running_sum_credits
    other = private_notes_task(4, 5, answer="sum", eval_size=4)
    assert other.reward is final_answer_reward


def test_mixed_chain_phrasing_holds_one_template_out_for_evaluation():
    suite = PrivateNotesSuite(3, note_max=9, answer="chain", phrasing="mixed")
    train = {t.id for t in suite.templates("train")}
    test = {t.id for t in suite.templates("test")}
    assert train < test and test - train == {"chain.tally"}
    # and the evaluation reports it among the eval-only templates
    from llm.evaluation.held_out_problems import EVAL_ONLY_TEMPLATES

    assert test - train <= EVAL_ONLY_TEMPLATES
    assert {p.template for p in suite.fixed_set("test", 30)} == test


@pytest.mark.parametrize("n", [1, 2, 3, 8])
def test_role_prompts_cover_every_position(n):
    prompts = chain_role_prompts(n)
    assert len(prompts) == n
    if n > 1:
        assert "first" in prompts[0] and "last" in prompts[-1]
        assert all("previous speaker" in p for p in prompts[1:])


def test_running_sum_reward_credits_each_turn_that_states_the_total():
    values = (3, 4, 2)
    speakers = [0, 1, 2]
    assert running_sum_reward(["3", "7", "9"], speakers, values) == 1.0
    # The second speaker says its own number instead of the total: it and the last lose credit
    # only where their statement is wrong.
    assert running_sum_reward(["3", "4", "9"], speakers, values) == pytest.approx(2 / 3)
    assert running_sum_reward(["I have 3.", "7", "nine"], speakers, values) == pytest.approx(2 / 3)
    assert running_sum_reward(["5", "6", "10"], speakers, values) == 0.0
    # An unevaluated expression is not a total (as for every final answer).
    assert running_sum_reward(["3", "3 + 4", "9"], speakers, values) == pytest.approx(2 / 3)
    # A speaker heard twice adds its number once (the total is over distinct speakers).
    assert running_sum_reward(["3", "7", "7"], [0, 1, 0], values) == 1.0
    with pytest.raises(ValueError):
        running_sum_reward(["3"], [0, 1], values)


def test_chain_random_guess_floor_is_the_sums():
    assert random_guess_floor(2, 5, "chain") == Fraction(5, 25)
    assert random_guess_floor(3, 5, "chain") == random_guess_floor(3, 5, "sum")
