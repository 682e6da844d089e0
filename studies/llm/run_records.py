"""What a finished ``teamtr train`` run amounts to, read from its directory: the record the
comparison report and the seed study keep of every run, and what their tables and figures read
from such records.

``summarise(RunSpec)`` reads a run directory (``config.json``, ``metrics.jsonl``, the newest
checkpoint) and the ``teamtr eval`` results of its trained and untrained team, and returns the
held-out accuracy with its binomial standard error, stages trained, the per-stage training reward
and the KL of every update, and the time used on the run's budget clock.
"""

from __future__ import annotations

import argparse
import itertools
import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any


@dataclass(frozen=True)
class RunSpec:
    name: str
    run_dir: Path
    trained_eval: Path = Path("-")
    """``teamtr eval``'s result of the trained team; "-": the run's own last evaluation."""
    untrained_eval: Path | None = None
    """``teamtr eval``'s result of the untrained team, where there is one."""

    @classmethod
    def parse(cls, text: str) -> RunSpec:
        """``NAME=RUN_DIR[:TRAINED_EVAL.json[:UNTRAINED_EVAL.json]]``: a run alone is
        summarised from its own records."""
        name, _, rest = text.partition("=")
        parts = rest.split(":")
        if not name or not parts[0] or len(parts) > 3 or not all(parts):
            raise argparse.ArgumentTypeError(
                f"--run {text!r}: expected NAME=RUN_DIR[:TRAINED_EVAL.json[:UNTRAINED_EVAL.json]]"
            )
        trained = Path(parts[1]) if len(parts) > 1 else Path("-")
        return cls(name, Path(parts[0]), trained, Path(parts[2]) if len(parts) > 2 else None)

    def problem(self) -> str | None:
        """What keeps this run from being summarised (a missing or unreadable file), if any:
        said before any is read, so that a wrong argument is one line and exit code 2."""
        files = [self.run_dir / "config.json", self.run_dir / "metrics.jsonl"]
        files += [p for p in (self.trained_eval, self.untrained_eval) if p and str(p) != "-"]
        for path in files:
            try:
                text = path.read_text()
                if path.suffix == ".json":
                    json.loads(text)
            except (OSError, UnicodeDecodeError, json.JSONDecodeError) as error:
                return f"--run {self.name}: {path}: cannot read ({error})"
        return None


MEASURES = ("accuracy", "score")
"""What an evaluation's mean held-out score is called: ``accuracy`` where the task's metric
grades answers right or wrong, else ``score`` (``llm.problems.task.Task.measure``)."""


def measure_of(result: dict[str, Any], prefix: str = "") -> str:
    """The name an evaluation's record gives its mean held-out score (``prefix``: a group's,
    ``"template/t1/"``): ``accuracy``, or ``score`` (records before ``score`` say accuracy)."""
    return (
        "score" if prefix + "score" in result and prefix + "accuracy" not in result else "accuracy"
    )


def held_out(result: dict[str, Any], prefix: str = "") -> float:
    """The mean held-out score of an evaluation's record, whichever name it has."""
    return result[prefix + measure_of(result, prefix)]


def binomial_standard_error(accuracy: float, n: float) -> float:
    return math.sqrt(accuracy * (1.0 - accuracy) / n) if n > 0 else float("nan")


def mean_and_error(values: list[float]) -> dict[str, float | None]:
    """Mean and its standard error over seeds (sample standard deviation / sqrt(k))."""
    k = len(values)
    mean = sum(values) / k
    if k == 1:  # one seed has no spread to speak of (null in the JSON, not NaN)
        return {"mean": mean, "standard_error": None, "seeds": 1.0}
    spread = math.sqrt(sum((v - mean) ** 2 for v in values) / (k - 1))
    return {"mean": mean, "standard_error": spread / math.sqrt(k), "seeds": float(k)}


def value_at(points: list[tuple[float, float]], minutes: float) -> float:
    """The curve (minutes, value), starting at (0, untrained), at ``minutes``: linear between
    the points either side, the last value beyond the last point."""
    for (x0, y0), (x1, y1) in zip(points, points[1:], strict=False):
        if x0 <= minutes <= x1:
            return y0 if x1 == x0 else y0 + (y1 - y0) * (minutes - x0) / (x1 - x0)
    return points[-1][1]


def mean_until(points: list[tuple[float, float]], minutes: float) -> float:
    """The mean of the curve of ``value_at`` over [0, ``minutes``]: its area (trapezoids between
    the points, the last value held beyond the last point) over ``minutes``. Unlike the value at
    the budget it credits a run for getting there sooner, and it is not capped once two runs
    both reach the metric's ceiling before the budget."""
    if minutes <= 0:
        raise ValueError(f"mean over {minutes} minutes: expected a positive budget")
    inside = [(x, y) for x, y in points if x < minutes] + [(minutes, value_at(points, minutes))]
    area = sum(
        (x1 - x0) * (y0 + y1) / 2 for (x0, y0), (x1, y1) in zip(inside, inside[1:], strict=False)
    )
    return area / minutes


def held_out_drops(evaluations: list[dict[str, Any]], metric: str = "accuracy") -> int:
    """Evaluations whose ``metric`` fell by more than twice the standard error of the
    difference below the one before, sqrt(se_1^2 + se_2^2) (independent draws: conservative on
    a fixed question set, whose errors are positively correlated). Accuracy p on N questions
    has the binomial error sqrt(p (1 - p) / N); another metric carries its own
    ``<metric>_standard_error``. ``"accuracy"`` reads a ``score`` where the record has one."""

    def error(evaluation: dict[str, Any]) -> float:
        if metric == "accuracy" and measure_of(evaluation) == "accuracy":
            return binomial_standard_error(evaluation["accuracy"], evaluation["n"])
        if metric == "accuracy":  # a score: the standard error its evaluation measured
            return evaluation["standard_error"]
        return evaluation[f"{metric}_standard_error"]

    def value(evaluation: dict[str, Any]) -> float:
        return held_out(evaluation) if metric == "accuracy" else evaluation[metric]

    count = 0
    for before, after in zip(evaluations, evaluations[1:], strict=False):
        count += value(before) - value(after) > 2.0 * math.hypot(error(before), error(after))
    return count


def _read_json(path: Path) -> Any:
    try:
        return json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as error:
        raise SystemExit(f"{path}: cannot read ({error})") from None


def _evaluation(path: Path) -> dict[str, float]:
    return _evaluation_of(_read_json(path))


def _evaluation_of(result: dict[str, Any]) -> dict[str, float]:
    """The headline numbers, and the per-template ones (``template/<id>/<stat>``) when the
    evaluation has them."""
    templates = {k: v for k, v in result.items() if k.startswith("template/")}
    measure, value = measure_of(result), held_out(result)
    return {
        measure: value,
        "n": result["n"],
        # An accuracy's error is binomial; a score's is the one its evaluation measured.
        "standard_error": binomial_standard_error(value, result["n"])
        if measure == "accuracy"
        else result["standard_error"],
        "parse_failure_rate": result["parse_failure_rate"],
        "mean_tokens": result["mean_tokens"],
        **templates,
    }


def _headline(result: dict[str, Any]) -> dict[str, float]:
    evaluation = _evaluation_of(result)
    return {k: evaluation[k] for k in (measure_of(evaluation), "n", "standard_error")}


def budget_clock_minutes(run_dir: Path) -> float | None:
    """Time spent on the run's budget clock, from its newest valid checkpoint (None without)."""
    from llm.training.checkpoint import latest_checkpoint

    point = latest_checkpoint(run_dir).point
    return None if point is None else point.elapsed_seconds / 60.0


def _final_evaluation(spec: RunSpec, stages: list[dict[str, Any]]) -> dict[str, float] | None:
    """The trained team's evaluation: the eval file given, else the last stage's own; None
    for a run that never evaluates while training (``[run] eval_every = 0``: its checkpoints
    are evaluated afterwards, ``studies.llm.checkpoint_curves``)."""
    if str(spec.trained_eval) != "-":
        return _evaluation(spec.trained_eval)
    final = stages[-1].get("eval") if stages else None
    return _evaluation_of(final) if final else None


def summarise(spec: RunSpec) -> dict[str, Any]:
    config = _read_json(spec.run_dir / "config.json")
    lines = (spec.run_dir / "metrics.jsonl").read_text().splitlines()
    stages = [json.loads(line) for line in lines if line.strip()]
    return {
        "run_dir": str(spec.run_dir),
        "scheme": config["stage"]["scheme"],
        "n_agents": config["team"]["n_agents"],
        "radius": config["stage"]["radius"],
        "budget": {
            "minutes": config["run"]["time_budget_minutes"],
            "clock": config["run"]["budget_clock"],
            "threads": config["run"]["threads"],
        },
        "stages_trained": len(stages),
        # The budget is checked after each stage: the last stage may run past it.
        "budget_clock_minutes_used": budget_clock_minutes(spec.run_dir),
        "trained": _final_evaluation(spec, stages),
        "untrained": _evaluation(spec.untrained_eval) if spec.untrained_eval else None,
        "stages": [
            {
                "stage": s["stage"],
                "train_reward": s["train_reward"],
                "wall_seconds": s["wall_seconds"],
                # What sampling cost and found (absent from runs recorded before them):
                # training CPU of the stage, tokens generated, groups played (dynamic
                # sampling's discarded ones included) and each agent batch's groups with
                # differing rewards, the stage-start batch first.
                **{
                    key: s[key]
                    for key in (
                        "cpu_seconds",
                        "generated_tokens",
                        "groups_drawn",
                        "batch_signal_groups",
                    )
                    if key in s
                },
                "certificate_proxy": s["certificate"],
                "updates": [
                    {k: u[k] for k in ("agent", "kept", "kl", "surrogate", "backtracks")}
                    for u in s["updates"]
                ],
                # The held-out evaluation after this stage ([run] eval_every), for the curve.
                **({"eval": _headline(s["eval"])} if s.get("eval") else {}),
            }
            for s in stages
        ],
    }


def training_cpu_ends(run: dict[str, Any]) -> list[float] | None:
    """Each stage's end in training CPU minutes: the stages' own ``cpu_seconds`` summed
    (sampling and updates; evaluations, checkpoints and model loading excluded). None for runs
    recorded before stages kept their CPU time."""
    seconds = [stage.get("cpu_seconds") for stage in run["stages"]]
    if not seconds or any(s is None for s in seconds):
        return None
    return [total / 60.0 for total in itertools.accumulate(seconds)]


def stage_ends_minutes(run: dict[str, Any]) -> list[float]:
    """Each stage's end on the run's budget clock: the run's total clock time shared out in
    proportion to the stages' wall times (metrics.jsonl records wall time per stage only)."""
    walls = [stage["wall_seconds"] for stage in run["stages"]]
    used = run["budget_clock_minutes_used"] or sum(walls) / 60.0
    return [used * elapsed / sum(walls) for elapsed in itertools.accumulate(walls)]


def held_out_curve(run: dict[str, Any]) -> list[tuple[int, float]]:
    """(stages trained, greedy held-out accuracy) after every stage that evaluated."""
    return [(s["stage"] + 1, held_out(s["eval"])) for s in run["stages"] if "eval" in s]
