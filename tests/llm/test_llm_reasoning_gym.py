"""``[task] kind = "reasoning_gym"``: reasoning-gym's generators as a task. Held-out problems
and training draws come from disjoint seeds and never share a question; the answer taken from
a final message, written the ways a model writes it, earns the dataset's own verifier's full
score on every shipped config's own reference answers; a misspelt dataset or option stops the
CLI with one line naming the closest names (exit 2); ``train --check`` shows drawn problems
with the reward of their answers and of an empty message."""

from __future__ import annotations

import dataclasses
import math
import random
import re

import numpy as np
import pytest
from llm_test_support import REPO, SMOKE, teamtr

from llm.common.config import ConfigError, load_config, parse_override
from llm.interface.cli import main
from llm.problems.configured import build_task
from llm.problems.task import Dialogue, Task
from llm.problems.tasks import Problem

pytest.importorskip("reasoning_gym", reason="pip install 'teamtr[reasoning]'")

from llm.problems.reasoning_gym_task import (  # noqa: E402
    answer_in,
    answer_span,
    built_anew,
    generators,
    held_out_counts,
    reseedable,
)

CONFIGS = REPO / "llm" / "configs" / "reasoning"
TASK_CONFIGS = sorted(
    path
    for path in CONFIGS.glob("*.toml")
    if path.stem != "team" and not path.stem.endswith("_single")
)
"""Every shipped reasoning-gym task (team.toml sets no dataset; a single agent's twin,
``<name>_single``, has its team config's task)."""


def task_of(path, *sets: str) -> Task:
    return build_task(load_config(path, [parse_override(s) for s in sets]).task)


def final(task: Task, problem: Problem, message: str) -> tuple[float, float]:
    """The reward and the held-out score of a dialogue ending with ``message``."""
    dialogue = Dialogue(problem, ("Let me work it out.", message), (0, 1))
    return task.returns(dialogue).value, task.score(dialogue)


def wrapped(answer: str) -> dict[str, str]:
    """The reference answer as models write it."""
    return {
        "bare": answer,
        "full stop": f"{answer}.",
        "sentence": f"The answer is {answer}.",
        "colon": f"Answer: {answer}",
        "bold": f"The final answer is **{answer}**",
        "tags": f"Let me think.\n<answer>{answer}</answer>",
        "boxed": f"So we get \\boxed{{{answer}}}.",
        "after work": f"First I add things up.\nThen I check.\nFinal answer: {answer}",
    }


# -- the split ---------------------------------------------------------------------------------
@pytest.mark.parametrize("path", TASK_CONFIGS, ids=lambda p: p.stem)
def test_no_held_out_question_is_ever_drawn_for_training(path):
    task = task_of(path)
    held_out = {problem.question for problem in task.test}
    assert len(held_out) == len(task.test) == 50  # distinct questions, eval_size of them
    seeds = {problem.metadata["seed"] for problem in task.test}
    drawn = task.draw(np.random.default_rng(7), 500)
    assert not held_out & {problem.question for problem in drawn}
    assert not seeds & {problem.metadata["seed"] for problem in drawn}
    assert {task.split(problem.question) for problem in task.test} == {"test"}
    assert {task.split(problem.question) for problem in drawn} == {"train"}
    again = task.draw(np.random.default_rng(7), 500)
    assert [p.question for p in again] == [p.question for p in drawn]  # a function of the seed


@pytest.mark.parametrize("path", TASK_CONFIGS, ids=lambda p: p.stem)
def test_a_reseeded_generator_writes_the_problems_of_one_built_anew(path):
    """A problem's generator is the task's own with the problem's seed in place of its seed
    where its construction uses no seed: the same entry as the generator built anew for that
    seed, at seeds the check before did not look at."""
    for generator in generators(load_config(path).task):
        for seed in (3, 4096, 123_456_789, 2**31 - 2):
            assert (
                generator.problem(seed).metadata["entry"] == built_anew(generator.dataset, seed)[0]
            )
    if path.stem == "spell_backward":  # the generator it is for: a word list filtered each build
        assert all(generator.reseeds for generator in generators(load_config(path).task))


class SeededAtBuild:
    """A generator whose construction draws from its seed (a pool of numbers), as a
    reasoning-gym dataset may: reseeding it would keep the pool of another seed."""

    def __init__(self, config):
        self.config, self.seed, self.size = config, config.seed, config.size
        self.pool = random.Random(config.seed).sample(range(1000), 5)

    def __getitem__(self, index):
        return {"question": f"{self.pool[index]}?", "answer": str(self.pool[index])}


class SeededAtDraw(SeededAtBuild):
    """The same generator with its pool fixed and its seed read when it writes an entry."""

    def __init__(self, config):
        self.config, self.seed, self.size = config, config.seed, config.size
        self.pool = list(range(5))

    def __getitem__(self, index):
        number = random.Random(self.seed + index).choice(self.pool)
        return {"question": f"{number}?", "answer": str(number)}


@dataclasses.dataclass
class SeedOnly:
    seed: int = 0
    size: int = 1


def test_a_generator_whose_construction_reads_its_seed_is_built_anew_for_each_problem():
    assert not reseedable(SeededAtBuild(SeedOnly()))
    assert reseedable(SeededAtDraw(SeedOnly()))  # the seed read later: reseeded


def test_several_datasets_share_the_held_out_set_and_the_draws_by_weight():
    task = task_of(
        SMOKE,
        'task.kind="reasoning_gym"',
        'task.datasets=["leg_counting", "count_bits"]',
        "task.dataset_weights=[3, 1]",
        "task.eval_size=40",
    )
    held_out = [problem.metadata["dataset"] for problem in task.test]
    assert held_out.count("leg_counting") == 30 and held_out.count("count_bits") == 10
    drawn = [p.metadata["dataset"] for p in task.draw(np.random.default_rng(0), 4000)]
    share = drawn.count("leg_counting") / len(drawn)
    # A binomial share of 4000 draws: 5 standard errors of p = 3/4 is 0.034.
    assert abs(share - 0.75) < 5 * math.sqrt(0.75 * 0.25 / len(drawn))


@pytest.mark.parametrize(
    ("weights", "total"), [((1.0,), 7), ((3.0, 1.0), 40), ((1.0, 1.0, 1.0), 10), ((0.2, 5.0), 3)]
)
def test_held_out_counts_add_up_and_lie_within_one_of_each_share(weights, total):
    counts = held_out_counts(weights, total)
    assert sum(counts) == total
    for count, weight in zip(counts, weights, strict=True):
        assert abs(count - total * weight / sum(weights)) < 1


# -- the answer in a message ---------------------------------------------------------------------
@pytest.mark.parametrize(
    ("message", "span"),
    [
        ("12", "12"),
        ("  olleh  \n", "olleh"),
        ("Step one.\n\nThe answer is 7 legs.", "7 legs."),
        ("answer: **abc**", "abc"),
        ("<answer>1</answer> then <answer>2</answer>", "2"),
        ("\\boxed{\\frac{1}{2}}", "\\frac{1}{2}"),
        ("Answer: 3\nI checked it twice.", "3"),
        ("", ""),
    ],
)
def test_the_answer_span_is_the_first_rule_that_applies(message, span):
    assert answer_span(message) == span


def test_a_number_answer_is_the_last_number_of_the_span():
    assert answer_in("There are 1,024 legs, not 12", "5") == "12"
    assert answer_in("There are 1,024 legs", "5") == "1024"
    assert answer_in("The answer is -3.5 degrees.", "2") == "-3.5"
    assert answer_in("1. 6 * 9 = 54\n2. 54 - 4 = 50\n\nSo", "7") == "50"  # cut: the message's
    assert answer_in("The answer is ssiw.", "abc") == "ssiw."  # a word: the span itself


def test_a_list_item_s_number_is_not_an_answer():
    # a trained answerer's message cut in its second item: "2." numbers the item; the count
    # it states is 10
    cut = '1. The letter "e" appears 10 times in the text.\n2. The text is "der'
    assert answer_in(cut, "2") == "10"
    assert answer_in("1. Add them.\n2. So the answer is 3", "3") == "3"
    assert answer_in("  3) The answer: 7", "7") == "7"
    assert answer_in("12.", "12") == "12"  # a line that is only a number answers it
    assert answer_in("The sum is\n12. ", "12") == "12"


@pytest.mark.parametrize("path", TASK_CONFIGS, ids=lambda p: p.stem)
def test_each_dataset_s_own_answers_written_as_models_write_them_score_1(path):
    task = task_of(path)
    answered = [problem for problem in task.test if problem.answer][:20]
    assert answered, f"{path.stem}: no reference answers to try"
    for index, problem in enumerate(answered):
        for how, message in wrapped(problem.answer).items():
            assert final(task, problem, message) == (1.0, 1.0), (path.stem, how, message)
        assert final(task, problem, "") == (0.0, 0.0)
        other = next(
            (
                p.answer
                for p in answered[index + 1 :] + answered[:index]
                if p.answer != problem.answer
            ),
            None,
        )
        if other is not None:
            reward, score = final(task, problem, f"The answer is {other}.")
            assert reward < 1.0 and score == 0.0, (path.stem, problem.answer, other)


def test_without_partial_credit_only_a_full_score_is_rewarded():
    config = REPO / "llm" / "configs" / "reasoning" / "letter_counting.toml"
    with_credit = task_of(config)
    without = task_of(config, "task.partial_credit=false")
    problem = next(p for p in with_credit.test if p.answer == "1")
    # "100" holds the reference "1": the verifier's partial credit, len("1") / len("100")
    gamed = final(with_credit, problem, "The answer is 100.")
    assert gamed == (pytest.approx(1 / 3), 0.0)
    assert final(without, problem, "The answer is 100.") == (0.0, 0.0)
    assert final(without, problem, "The answer is 1.") == (1.0, 1.0)
    with pytest.raises(ConfigError, match=r"partial_credit = false is for kind"):
        load_config(SMOKE, [parse_override("task.partial_credit=false")])


# -- bad names -----------------------------------------------------------------------------------
def test_config_keys_of_a_reasoning_gym_task():
    with pytest.raises(ConfigError, match=r'kind = "reasoning_gym" needs datasets'):
        load_config(SMOKE, [parse_override('task.kind="reasoning_gym"')])
    with pytest.raises(ConfigError, match=r'are for kind = "reasoning_gym"'):
        load_config(SMOKE, [parse_override('task.datasets=["leg_counting"]')])
    with pytest.raises(ConfigError, match=r"must name each dataset once"):
        load_config(
            SMOKE,
            [
                parse_override('task.kind="reasoning_gym"'),
                parse_override('task.datasets=["a", "a"]'),
            ],
        )
    base = ['task.kind="reasoning_gym"', 'task.datasets=["leg_counting", "count_bits"]']
    with pytest.raises(ConfigError, match=r"needs one weight per dataset \(2"):
        load_config(SMOKE, [parse_override(s) for s in [*base, "task.dataset_weights=[1]"]])
    with pytest.raises(ConfigError, match=r"must be finite and > 0"):
        load_config(SMOKE, [parse_override(s) for s in [*base, "task.dataset_weights=[1, 0]"]])
    with pytest.raises(ConfigError, match=r"dataset_args.leg_counting.seed: set by the task"):
        task_of(SMOKE, *base, "task.dataset_args={leg_counting={seed=3}}")
    with pytest.raises(ConfigError, match=r"'count_bit' is not one of \[task\] datasets"):
        task_of(SMOKE, *base, "task.dataset_args={count_bit={max_n=3}}")
    with pytest.raises(ConfigError, match=r"leg_counting rejects the options"):
        task_of(SMOKE, *base, "task.dataset_args={leg_counting={min_animals=5, max_animals=2}}")


@pytest.mark.parametrize(
    ("sets", "named"),
    [
        (['task.datasets=["leg_countin"]'], "no dataset 'leg_countin'; closest: 'leg_counting'"),
        (
            ['task.datasets=["leg_counting"]', "task.dataset_args={leg_counting={max_animal=2}}"],
            "leg_counting has no option 'max_animal'; closest: 'max_animals'",
        ),
    ],
    ids=["dataset", "option"],
)
def test_a_misspelt_dataset_or_option_stops_the_cli_with_one_line_naming_the_closest(sets, named):
    arguments = sum((["--set", s] for s in ['task.kind="reasoning_gym"', *sets]), [])
    result = teamtr("train", "--config", str(SMOKE), *arguments, "--check")
    assert result.returncode == 2, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and named in lines[0], lines


def test_the_check_shows_drawn_problems_with_the_rewards_of_their_answer_and_of_none(capsys):
    sets = ['task.kind="reasoning_gym"', 'task.datasets=["leg_counting"]', "task.eval_size=8"]
    settings = sum((["--set", s] for s in sets), [])
    assert main(["train", "--config", str(SMOKE), *settings, "--check"]) == 0
    printed = capsys.readouterr().out
    drawn = [line for line in printed.splitlines() if line.startswith("drawn: ")]
    assert len(drawn) == 3, printed
    for line in drawn:
        assert re.search(r"'Your task is to count how\.\.\..*' -> answer '\d+'", line), line
        assert line.endswith("reward of that answer 1, of an empty message 0"), line
    assert "held-out score of the reference answers 1 on" in printed


def test_each_single_agent_twin_plays_its_team_s_task_with_the_team_s_tokens():
    twins = sorted(CONFIGS.glob("*_single.toml"))
    assert len(twins) >= 4
    for twin in twins:
        team = load_config(twin.with_name(twin.stem.removesuffix("_single") + ".toml"))
        alone = load_config(twin)
        assert alone.task == team.task, twin.stem
        if team.task.environment:  # with a tool: one agent speaks the team's turns (call, answer)
            assert (alone.team.n_agents, alone.sampler.turns) == (1, team.sampler.turns)
            assert alone.sampler.max_new_tokens == max(team.sampler.max_new_tokens), twin.stem
            continue
        assert (alone.team.n_agents, alone.sampler.turns) == (1, 1), twin.stem
        assert alone.sampler.max_new_tokens == sum(team.sampler.max_new_tokens), twin.stem
