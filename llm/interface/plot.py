"""``teamtr plot``: one run's training curve, drawn from its ``metrics.jsonl`` to a PNG.

Two panels over the stages (numbered from 1, as the console and the checkpoints number them):
the training reward of each stage's first sampling and, where the run measured it
(``[run] eval_every``), the held-out accuracy or score with its standard error; below, each
stage's certificate (Thm 3.6) and, where the run held out groups (``[stage]
certificate_groups``), the measured bound on its improvement (``teamtr.measured``). It reads only ``metrics.jsonl``: no model loads, and a run still in
progress can be drawn. TensorBoard shows the same scalars (``tensorboard --logdir runs``);
``teamtr compare-report`` draws several runs against each other.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from llm.common.config import ConfigError
from llm.interface.cli_args import add_command

CURVES_FILE = "curves.png"
"""Where the figure goes by default: inside the run directory."""


EXAMPLES = """examples:
  teamtr plot --run runs/try                       # runs/try/curves.png
  teamtr plot --run runs/try --out try.png
  tensorboard --logdir runs                        # every run's scalars, live"""


def add_parser(commands: Any) -> None:
    """``teamtr plot``: its line in the list of commands, its ``--help`` and its options."""
    parser = add_command(
        commands,
        "plot",
        "draw a run's training reward and held-out curve to a PNG",
        "Draw one run's training reward, held-out accuracy (or score) and certificate per "
        "stage from its metrics.jsonl, to a PNG; no model loads.",
        EXAMPLES,
    )
    add_arguments(parser)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--run", required=True, help="run directory of `teamtr train`")
    parser.add_argument(
        "--out", help=f"the PNG to write (default: {CURVES_FILE} inside the run directory)"
    )


def read_records(metrics: Path) -> list[dict[str, Any]]:
    """The records of a ``metrics.jsonl`` file; a ``ConfigError`` naming a line that is not
    JSON."""
    records = []
    for number, line in enumerate(metrics.read_text().splitlines(), 1):
        if not line.strip():
            continue
        try:
            records.append(json.loads(line))
        except ValueError:
            raise ConfigError(f"{metrics}:{number}: not a JSON line") from None
    return records


def stage_records(run_dir: Path) -> list[dict[str, Any]]:
    """The run's stage records; a ``ConfigError`` naming the file when there are none."""
    metrics = run_dir / "metrics.jsonl"
    if not run_dir.is_dir():
        raise ConfigError(f"--run {run_dir}: no such directory")
    if not metrics.is_file():
        raise ConfigError(
            f"--run {run_dir}: no metrics.jsonl (not a run directory of `teamtr train`)"
        )
    records = read_records(metrics)
    if not records:
        raise ConfigError(f"--run {run_dir}: metrics.jsonl holds no stage yet")
    return records


def run_plot(args: argparse.Namespace) -> int:
    run_dir = Path(args.run)
    records = stage_records(run_dir)
    out = Path(args.out) if args.out else run_dir / CURVES_FILE
    if out.suffix.lower() != ".png":
        raise ConfigError(f"--out {out}: the figure is a PNG; give a name ending .png")
    draw(records, out, run_dir.name)
    held_out = [r for r in records if "eval" in r]
    print(
        f"{out}: {_count(len(records), 'stage')}, "
        f"{_count(len(held_out), 'held-out evaluation')}"
        + (f", last {_measure_of(held_out[-1]['eval'])}" if held_out else "")
    )
    return 0


def _count(number: int, thing: str) -> str:
    return f"{number} {thing}{'' if number == 1 else 's'}"


def _measure_of(evaluation: dict[str, float]) -> str:
    name = "accuracy" if "accuracy" in evaluation else "score"
    return f"{name} {evaluation[name]:.3f}"


def measured_bounds(records: list[dict[str, Any]]) -> tuple[list[int], list[float], float | None]:
    """The stages (numbered from 1) whose improvement was measured, their bounds, and the
    level (None where no stage was measured)."""
    measured = [r for r in records if r.get("measured") is not None]
    level = float(measured[0]["measured"]["level"]) if measured else None
    return [r["stage"] + 1 for r in measured], [r["measured"]["bound"] for r in measured], level


def draw(records: list[dict[str, Any]], out: Path, title: str) -> None:
    """The two panels of the module's docstring, written to ``out``."""
    import matplotlib

    matplotlib.use("Agg")  # a file, never a window
    import matplotlib.pyplot as plt
    from matplotlib.ticker import MaxNLocator

    stages = [r["stage"] + 1 for r in records]  # metrics.jsonl holds the index: stage k - 1
    figure, (top, bottom) = plt.subplots(
        2, 1, figsize=(7, 5.5), sharex=True, gridspec_kw={"height_ratios": [2, 1]}
    )
    rewards = [
        r["train_reward"] if r["train_reward"] is not None else float("nan") for r in records
    ]
    top.plot(stages, rewards, "o-", label="training reward (first sampling of the stage)")
    held_out = [r for r in records if "eval" in r]
    if held_out:
        name = "accuracy" if "accuracy" in held_out[0]["eval"] else "score"
        top.errorbar(
            [r["stage"] + 1 for r in held_out],
            [r["eval"][name] for r in held_out],
            yerr=[r["eval"].get("standard_error", 0.0) for r in held_out],
            fmt="s-",
            capsize=3,
            label=f"held-out {name} (+- standard error, n = {int(held_out[-1]['eval']['n'])})",
        )
    top.set_ylabel("reward / held-out")
    top.set_title(title)
    top.legend(loc="best", fontsize="small")
    top.grid(alpha=0.3)
    bottom.bar(stages, [r["certificate"] for r in records], color="tab:gray", label="Thm 3.6")
    bounded, bounds, level = measured_bounds(records)
    if level is not None:
        label = f"measured, {100 * level:g}% confidence"
        bottom.plot(bounded, bounds, "D-", color="tab:green", label=label)
        bottom.legend(loc="best", fontsize="small")
    bottom.axhline(0.0, color="black", linewidth=0.8)
    bottom.set_ylabel("certificate")
    bottom.set_xlabel("stage")
    bottom.xaxis.set_major_locator(MaxNLocator(integer=True))  # stages are whole
    bottom.grid(alpha=0.3)
    figure.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(out, dpi=100)
    plt.close(figure)
