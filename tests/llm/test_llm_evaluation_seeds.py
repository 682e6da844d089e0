"""An evaluation draws from its own generator: evaluating a team never changes how it trains.

Greedy dialogues do not depend on a seed, but the generation seed used to be the sampler's
next draw, so a run that evaluated after a stage trained on other rollouts afterwards than one
that did not. Tiny random models, real sampler, real `teamtr train` runs.
"""

from __future__ import annotations

import copy
import json

import numpy as np
from llm_test_support import TIMING_KEYS, arithmetic_sampler
from test_llm_resume import final_state, write_config

from llm.evaluation.held_out_problems import evaluate_team
from llm.interface.cli import main
from llm.problems.tasks import ArithmeticSuite


def test_an_evaluation_leaves_the_sampler_alone_and_repeats_itself(char_chat, char_team):
    problems = ArithmeticSuite(1).sample("test", 5, np.random.default_rng(1))
    evaluated, untouched = (arithmetic_sampler(char_chat, temperature=1.5) for _ in range(2))
    before = copy.deepcopy(evaluated.rng.bit_generator.state)
    first = [evaluate_team(char_team, evaluated, problems, samples=s) for s in (1, 3)]
    assert evaluated.rng.bit_generator.state == before
    # Sampled evaluation of one team twice: the same dialogues, so the same numbers.
    assert [evaluate_team(char_team, evaluated, problems, samples=s) for s in (1, 3)] == first
    assert evaluated.sample(char_team).episodes == untouched.sample(char_team).episodes


def training_records(run_dir) -> list[dict]:
    records = []
    for line in (run_dir / "metrics.jsonl").read_text().splitlines():
        record = json.loads(line)
        for key in (*TIMING_KEYS, "eval"):
            record.pop(key, None)
        records.append(record)
    return records


def test_a_run_that_evaluates_every_stage_trains_like_one_that_never_does(tmp_path):
    runs = {}
    for every in (1, 0):
        directory = tmp_path / f"eval_every_{every}"
        directory.mkdir()
        config = write_config(directory)
        config.write_text(config.read_text().replace("eval_every = 1", f"eval_every = {every}"))
        assert main(["train", "--config", str(config), "--name", "run", "--no-progress"]) == 0
        runs[every] = directory / "runs" / "run"
    assert "eval" in json.loads((runs[1] / "metrics.jsonl").read_text().splitlines()[0])
    assert training_records(runs[1]) == training_records(runs[0])
    expected, got = final_state(runs[0]), final_state(runs[1])
    assert expected.keys() == got.keys()
    assert all((expected[k] == got[k]).all() for k in expected), "final states differ"
