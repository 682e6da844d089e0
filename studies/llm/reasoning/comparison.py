"""The reasoning-gym comparison of docs/reasoning_gym.md: a team, teamtr's single agent and TRL's
``GRPOTrainer``, each trained to the same budget of its process's CPU time on the same problems,
then scored greedily on the same held-out problems. Reads what the study's commands wrote:

- ``RESULTS/untrained/<dataset>.json`` and ``<dataset>_single.json``: ``teamtr eval --config``
  of the untrained team and single agent (TRL's untrained model is the single agent's: the same
  prompts, model and metric);
- ``RESULTS/trained/<dataset>-{team,single}-s<seed>.json``: ``teamtr eval --run`` of each run,
  and ``RESULTS/run_records/<dataset>-{team,single}-s<seed>/metrics.jsonl``: the CPU-seconds
  and stages of its training;
- ``RESULTS/trl/<dataset>-trl-s<seed>.json``: ``bench/peer_grpo_task.py``'s record.

Prints the markdown table (the accuracy of the held-out set's most common answer given to every
problem, held out untrained → trained, mean ± standard error over seeds, CPU,
stages or steps) and writes it as JSON and as a figure::

    python -m studies.llm.reasoning.comparison --results results/reasoning_gym \\
        --datasets chain_sum letter_counting --json results/reasoning_gym/study.json \\
        --plot figures/reasoning_gym_study.png

``--study tool`` reads the study with the calculator tool instead (``STUDIES``): the team and
the single agent with the calculator (``reasoning/<dataset>_tool`` and ``_tool_single``) and TRL
without a tool, all in float32 on one machine (runs and evaluations named ``-f32amx``).
"""

from __future__ import annotations

import argparse
import json
import math
import re
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from studies.llm.run_records import mean_and_error


@dataclass(frozen=True)
class Arm:
    """One arm of a study: whose runs (``trained_runs``'s ``arm`` and ``variant``), its name in
    the table, and the untrained evaluation of its format (``untrained/<untrained>.json``, with
    ``{dataset}`` filled in)."""

    arm: str
    variant: str
    name: str
    untrained: str

    @property
    def key(self) -> str:
        """Its tag in the runs' names (``<dataset>-<key>-sS``): "team", "tool-f32amx", ..."""
        return f"{self.arm}{self.variant}"


STUDIES = {
    "main": (
        Arm("team", "", "team of two", "{dataset}"),
        Arm("single", "", "teamtr single agent", "{dataset}_single"),
        # TRL's untrained model is the single agent's: the same prompts, model and metric
        Arm("trl", "", "TRL GRPOTrainer", "{dataset}_single"),
    ),
    "tool": (
        Arm("tool", "-f32amx", "team of two, calculator", "f32amx-{dataset}_tool"),
        Arm(
            "single",
            "-tool-f32amx",
            "teamtr single agent, calculator",
            "f32amx-{dataset}_tool_single",
        ),
        Arm("trl", "-f32amx", "TRL GRPOTrainer, no tool", "f32amx-{dataset}_single"),
    ),
}
"""The studies of docs/reasoning_gym.md: the three arms at equal CPU ("main"), and the same
with the calculator tool for teamtr's arms, side by side in float32 on one machine ("tool")."""


def untrained_path(results: Path, dataset: str, arm: Arm) -> Path:
    """The untrained evaluation of ``arm``'s format on ``dataset``."""
    return results / "untrained" / f"{arm.untrained.format(dataset=dataset)}.json"


def untrained_accuracy(results: Path, dataset: str, arm: str | Arm) -> float:
    """The untrained model's held-out accuracy in the arm's format (an ``Arm``, or a key of
    the main study's: "team", "single" or "trl")."""
    if isinstance(arm, str):
        arm = next(a for a in STUDIES["main"] if a.arm == arm)
    return float(json.loads(untrained_path(results, dataset, arm).read_text())["accuracy"])


def constant_answer(results: Path, dataset: str) -> tuple[str, float]:
    """The held-out problems' most common reference answer and the accuracy of a model that
    gives it to every problem: what a policy that learns the answers' prior, not the task,
    reaches (read from the untrained evaluation's transcripts, which hold every reference)."""
    path = results / "untrained" / f"{dataset}.transcripts.jsonl"
    rows = [json.loads(line) for line in path.read_text().splitlines() if line]
    answer, count = Counter(row["reference_answer"] for row in rows).most_common(1)[0]
    return answer, count / len(rows)


def trained_runs(results: Path, dataset: str, arm: str, variant: str = "") -> list[dict[str, Any]]:
    """Every finished seed of one arm: its held-out accuracy, CPU-seconds of training and the
    stages (teamtr) or optimizer steps (TRL) those bought. ``variant``: the runs named
    ``<dataset>-<arm><variant>-sS`` (e.g. "-nopartial", the same arm without partial credit)."""
    runs = []
    folder = results / ("trl" if arm == "trl" else "trained")
    tag = f"{arm}{variant}"
    for path in sorted(folder.glob(f"{dataset}-{tag}-s*.json")):
        named = re.fullmatch(rf"{re.escape(dataset)}-{re.escape(tag)}-s(\d+)", path.stem)
        if named is None:  # e.g. another dataset whose name starts with this one's
            continue
        seed = int(named.group(1))
        record = json.loads(path.read_text())
        if arm == "trl":
            accuracy = record["trained"]["accuracy"]
            cpu, steps = record["cpu_seconds"], record["steps"]
        else:
            accuracy = record["accuracy"]
            metrics = results / "run_records" / path.stem / "metrics.jsonl"
            lines = [json.loads(line) for line in metrics.read_text().splitlines() if line]
            stages = [line for line in lines if "cpu_seconds" in line]
            cpu, steps = sum(s["cpu_seconds"] for s in stages), len(stages)
        runs.append({"seed": seed, "accuracy": accuracy, "cpu_seconds": cpu, "steps": steps})
    return runs


def study_table(
    results: Path, datasets: list[str], study: str = "main"
) -> dict[str, dict[str, Any]]:
    """Per dataset: the constant answer's accuracy, and per arm of ``study`` (keyed by its tag
    in the runs' names, ``Arm.key``) its name in the table, untrained accuracy, runs and trained
    mean ± standard error."""
    table: dict[str, dict[str, Any]] = {}
    for dataset in datasets:
        answer, accuracy = constant_answer(results, dataset)
        table[dataset] = {"constant answer": {"answer": answer, "accuracy": accuracy}}
        for arm in STUDIES[study]:
            runs = trained_runs(results, dataset, arm.arm, arm.variant)
            summary = mean_and_error([r["accuracy"] for r in runs]) if runs else None
            table[dataset][arm.key] = {
                "name": arm.name,
                "untrained": untrained_accuracy(results, dataset, arm),
                "runs": runs,
                "trained": summary,
            }
    return table


def _arm_names(row_of: dict[str, Any]) -> list[str]:
    return [name for name in row_of if name != "constant answer"]


def _percent(summary: dict[str, float | None] | None) -> str:
    if summary is None:
        return "not run"
    text = f"{100 * float(summary['mean'] or 0.0):.1f}%"
    if summary["standard_error"] is not None:
        text += f" ± {100 * summary['standard_error']:.1f}"
    return text


def markdown(table: dict[str, dict[str, Any]]) -> str:
    lines = [
        "| dataset | arm | a constant answer | untrained | trained, per seed | trained, mean ± SE | gain (points) "
        "| CPU-s of training, per seed | stages or steps |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for dataset, row_of in table.items():
        constant = row_of["constant answer"]
        best = f"'{constant['answer']}': {100 * constant['accuracy']:.0f}%"
        for arm in _arm_names(row_of):
            row = row_of[arm]
            runs, summary = row["runs"], row["trained"]
            per_seed = ", ".join(f"{100 * r['accuracy']:.0f}%" for r in runs) or "–"
            gain = "–" if summary is None else f"{100 * (summary['mean'] - row['untrained']):+.1f}"
            cpu = ", ".join(f"{r['cpu_seconds']:.0f}" for r in runs) or "–"
            steps = ", ".join(str(r["steps"]) for r in runs) or "–"
            lines.append(
                f"| `{dataset}` | {row['name']} | {best} | {100 * row['untrained']:.0f}% | {per_seed} "
                f"| {_percent(summary)} | {gain} | {cpu} | {steps} |"
            )
    return "\n".join(lines)


def plot(table: dict[str, dict[str, Any]], path: Path) -> None:
    """Per dataset, per arm: the untrained accuracy (hollow) and the trained mean ± SE (filled),
    every seed a dot."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axes = plt.subplots(figsize=(2.6 + 2.2 * len(table), 4))
    width = 0.26
    for d, row_of in enumerate(table.values()):
        constant = 100 * row_of["constant answer"]["accuracy"]
        axes.hlines(constant, d - 1.6 * width, d + 1.6 * width, colors="grey", linestyles=":")
        for a, arm in enumerate(_arm_names(row_of)):
            row = row_of[arm]
            x = d + (a - 1) * width
            color = f"C{a}"
            label = row["name"] if d == 0 else None
            axes.bar(x, 100 * row["untrained"], width * 0.9, fill=False, edgecolor=color)
            summary = row["trained"]
            if summary is None:
                continue
            error = summary["standard_error"]
            axes.bar(
                x,
                100 * summary["mean"],
                width * 0.9,
                color=color,
                alpha=0.55,
                yerr=None if error is None else 100 * error,
                capsize=3,
                label=label,
            )
            axes.plot(
                [x] * len(row["runs"]), [100 * r["accuracy"] for r in row["runs"]], "k.", ms=4
            )
    axes.set_xticks(range(len(table)), list(table))
    axes.set_ylabel("held-out accuracy (%), greedy")
    rows = [row_of[arm] for row_of in table.values() for arm in _arm_names(row_of)]
    top = max(
        [100 * r["accuracy"] for row in rows for r in row["runs"]]
        + [100 * row["untrained"] for row in rows]
        + [100 * row_of["constant answer"]["accuracy"] for row_of in table.values()]
    )
    axes.set_ylim(0, min(100, 10 * math.ceil(top / 10) + 10))
    axes.set_title(
        "hollow: untrained; filled: trained (mean ± SE); dots: seeds;\n"
        "dotted: the held-out set's most common answer given to every problem",
        fontsize=8,
    )
    # below the axes: bars near 100% leave no room inside them
    columns = 3 if len(table) >= 3 else 1  # a narrow figure stacks the names
    figure.legend(fontsize=8, loc="lower center", ncol=columns, frameon=False)
    figure.tight_layout(rect=(0, 0.07 if columns == 3 else 0.15, 1, 1))
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, dpi=120)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--results", type=Path, default=Path("results/reasoning_gym"))
    parser.add_argument("--datasets", nargs="+", required=True)
    parser.add_argument(
        "--study", choices=sorted(STUDIES), default="main", help="which arms (STUDIES)"
    )
    parser.add_argument("--json", type=Path, help="the table as JSON")
    parser.add_argument("--plot", type=Path, help="the figure (PNG)")
    args = parser.parse_args(argv)
    missing = [
        str(path)
        for d in args.datasets
        for path in (
            args.results / "untrained" / f"{d}.json",  # its transcripts hold the references
            *(untrained_path(args.results, d, arm) for arm in STUDIES[args.study]),
        )
        if not path.is_file()
    ]
    if missing:
        missing = list(dict.fromkeys(missing))
        parser.error(f"no untrained evaluation: {', '.join(missing)} (teamtr eval --config ...)")
    table = study_table(args.results, args.datasets, args.study)
    print(markdown(table))
    if args.json:
        args.json.write_text(json.dumps(table, indent=1) + "\n")
    if args.plot:
        plot(table, args.plot)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
