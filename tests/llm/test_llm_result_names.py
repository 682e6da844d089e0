"""Results name what they measure: ``accuracy`` where the held-out metric grades an answer
right or wrong (math-verify, the ready-made graders, a metric declared ``grading``), else
``score`` (a reward of one's own standing in for the metric), in ``teamtr eval``'s results,
``metrics.jsonl``, TensorBoard and ``compare-report``; files that say ``accuracy`` still read."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from llm_test_support import SMOKE
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from llm.interface.cli import main
from llm.problems.task import Dialogue, Task
from llm.problems.tasks import Problem
from llm.rewards import contains_answer, exact_match
from studies.llm.run_records import RunSpec, held_out, summarise

CAPITALS = [("France", "Paris"), ("Italy", "Rome"), ("Spain", "Madrid"), ("Peru", "Lima")]
SUMS = [(1, 2), (3, 4), (5, 6), (2, 7)]
OVERLAP = '''
def overlap(dialogue):
    """Partial credit: the share of the answer's letters the final message uses."""
    letters = set(dialogue.problem.answer.lower())
    return len(letters & set(dialogue.final.lower())) / len(letters)
'''


def own(dialogue: Dialogue) -> float:
    return 0.5


def declared(dialogue: Dialogue) -> float:
    return float(dialogue.final == dialogue.problem.answer)


declared.grading = True  # type: ignore[attr-defined]

TEXT = [Problem("Capital of France?", "Paris")]
NUMBERS = [Problem("1 + 2?", "3")]


@pytest.mark.parametrize(
    ("task", "measure"),
    [
        (Task(NUMBERS, NUMBERS), "accuracy"),  # math-verify
        (Task(TEXT, TEXT), "accuracy"),  # math-verify, failing closed
        (Task(TEXT, TEXT, reward=own), "score"),  # the reward stands in for the metric
        (Task(NUMBERS, NUMBERS, reward=own), "accuracy"),  # math-verify grades every answer
        (Task(TEXT, TEXT, reward=own, metric=exact_match), "accuracy"),
        (Task(TEXT, TEXT, metric=contains_answer), "accuracy"),
        (Task(NUMBERS, NUMBERS, metric=own), "score"),
        (Task(NUMBERS, NUMBERS, metric=own, grading=True), "accuracy"),
        (Task(NUMBERS, NUMBERS, metric=declared), "accuracy"),  # declared by its attribute
        (Task(NUMBERS, NUMBERS, grading=False), "score"),
    ],
)
def test_a_task_says_what_its_held_out_mean_is(task, measure):
    assert task.measure(task.test) == measure


def trained(tmp_path: Path, rows: str, reward: str) -> Path:
    (tmp_path / "rows.csv").write_text("question,answer\n" + rows)
    (tmp_path / "own.py").write_text(OVERLAP)
    config = tmp_path / "team.toml"
    config.write_text(
        f'extends = "{SMOKE}"\n[task]\nkind = "dataset"\ntrain_file = "rows.csv"\n'
        f'test_file = "rows.csv"\nreward = "{reward}"\n[stage]\nstages = 1\n'
        f'[run]\noutput_dir = "{tmp_path / "runs"}"\nname = "r"\n'
    )
    assert main(["train", "--config", str(config), "--no-progress"]) == 0
    return tmp_path / "runs" / "r"


def logged(run: Path) -> set[str]:
    (events,) = run.rglob("events.out.tfevents.*")
    accumulator = EventAccumulator(str(events))
    accumulator.Reload()
    return {tag for tag in accumulator.Tags()["scalars"] if tag.startswith("eval/")}


def test_a_continuous_reward_is_a_score_and_math_verify_an_accuracy(tmp_path):
    texts = "".join(f"Capital of {country}?,{city}\n" for country, city in CAPITALS)
    sums = "".join(f"What is {a} + {b}?,{a + b}\n" for a, b in SUMS)
    for name, rows, reward, measure in (
        ("overlap", texts, "own:overlap", "score"),
        ("sums", sums, "math_verify", "accuracy"),
    ):
        folder = tmp_path / name
        folder.mkdir()
        run = trained(folder, rows, reward)
        (stage,) = [json.loads(line) for line in (run / "metrics.jsonl").open()]
        other = {"score": "accuracy", "accuracy": "score"}[measure]
        assert measure in stage["eval"] and other not in stage["eval"], stage["eval"]
        assert 0.0 <= stage["eval"][measure] <= 1.0 and stage["eval"]["n"] == 4
        assert f"eval/{measure}" in logged(run) and f"eval/{other}" not in logged(run)
        out = folder / "eval.json"
        assert main(["eval", "--run", str(run), "--json", str(out)]) == 0
        result = json.loads(out.read_text())
        assert result[measure] == stage["eval"][measure] and other not in result
        summary = summarise(RunSpec(name, run))
        assert held_out(summary["trained"]) == stage["eval"][measure]
        assert summary["stages"][0]["eval"][measure] == stage["eval"][measure]


def test_results_that_say_accuracy_still_read():
    record = {"accuracy": 0.25, "n": 4, "template/t1/accuracy": 0.5}
    assert held_out(record) == 0.25 and held_out(record, "template/t1/") == 0.5
    assert held_out({"score": 0.75, "n": 4}) == 0.75
