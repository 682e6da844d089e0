"""The step-size map (docs/step_size.md): where resampling pays, read from a seed study's runs.

Each method is named ``<scheme>-d<tag>`` (``llm/configs/stepsize/``: ``d004`` is δ = 0.04,
``d02`` 0.2, ``d1`` 1.0); its runs are ``<method>-s<seed>``. From every run's held-out curve
(``studies.llm.checkpoint_curves``: every stage's checkpoint evaluated afterwards) and its
``metrics.jsonl`` this writes, per scheme and δ:

- the last checkpoint's turn credit and accuracy (mean ± standard error over seeds), the
  training CPU it had used, and the turn credit at equal CPU (``--at``, the runs' budget:
  linear between the checkpoints either side; a run whose last checkpoint came earlier holds
  its last value);
- the turn credit's mean over the budget (the area under the held-out curve from 0 to ``--at``,
  over ``--at``): not capped when both schemes reach the ceiling before the budget;
- regressions per run: checkpoints whose turn credit (and, separately, accuracy) fell by more
  than twice the standard error of the difference below the one before, the untrained team
  first (``studies.llm.run_records.held_out_drops``);
- how the trust region bound the updates: the share that backtracked, that ended with a KL of
  at least half the radius, and that were rejected;
- per δ, each scheme's paired difference from stale, seed by seed (the runs of one seed share
  the problems and the stage-start batch): mean ± standard error of the differences in turn
  credit at the budget and in final accuracy, and on how many seeds the scheme came out above;
- for HAPPO, the effective sample size of each update's reweighted batch by its place in the
  stage (the k-th update's batch carries the ratios of the k agents before it);
- the stage certificates (Thm 3.6's sum of the kept updates' Thm 3.4 bounds) against the
  measured change of the training reward from one stage's first batch to the next one's
  (``rollout_rewards[0]``, a fresh batch of the stage-start team): the share of stages where
  the change was at least the certificate, and the mean certificate.

Usage::

    python -m studies.llm.step_size_map --curves results/stepsize_curves \\
        --metrics results/stepsize_metrics --untrained results/stepsize/untrained_teamtr-d1.json \\
        --json results/stepsize_map.json --plot figures/step_size_map.png --markdown
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path
from typing import Any

from studies.llm.run_records import (
    held_out,
    held_out_drops,
    mean_and_error,
    mean_until,
    value_at,
)

RADIUS_TAGS = {"d004": 0.04, "d02": 0.2, "d1": 1.0}
"""A method's radius tag -> δ, the [stage] radius: nats per turn of the average occupancy (the
mean over the dialogue's 4 turns, so an agent's one message may move 4δ nats)."""
RUN_NAME = re.compile(r"(?P<scheme>[a-z]+(?:-[a-z]+)*)-(?P<tag>d\d+)-s(?P<seed>\d+)")
"""``<scheme>-<tag>-s<seed>``; an ablation names itself after its scheme (``teamtr-norad``:
TeamTR's steps without the trust region, ``llm/configs/stepsize/teamtr_noradius_d1.toml``)."""


def parse_run(name: str) -> tuple[str, float, int]:
    """``teamtr-d1-s0`` -> ("teamtr", 1.0, 0); ``teamtr-norad-d1-s0`` -> ("teamtr-norad", 1.0, 0)."""
    match = RUN_NAME.fullmatch(name)
    if match is None or match["tag"] not in RADIUS_TAGS:
        raise ValueError(f"{name!r}: expected <scheme>-<{'|'.join(RADIUS_TAGS)}>-s<seed>")
    return match["scheme"], RADIUS_TAGS[match["tag"]], int(match["seed"])


def update_shares(stages: list[dict[str, Any]], radius: float) -> dict[str, float]:
    """Of every update of the run's stages: the shares that backtracked, that ended at a KL of
    at least radius / 2, and that were not kept."""
    updates = [u for stage in stages for u in stage["updates"]]
    if not updates:
        return {"updates": 0.0, "backtracked": 0.0, "near_radius": 0.0, "rejected": 0.0}
    count = float(len(updates))
    return {
        "updates": count,
        "backtracked": sum(u["backtracks"] > 0 for u in updates) / count,
        "near_radius": sum(u["kept"] and u["kl"] >= 0.5 * radius for u in updates) / count,
        "rejected": sum(not u["kept"] for u in updates) / count,
    }


def sample_size_by_position(stages: list[dict[str, Any]]) -> list[float] | None:
    """The mean effective sample size (``updates[].effective_sample_size``) of a stage's k-th
    update, k = 0, 1, ...: HAPPO's k-th agent trains on the stage-start batch weighted by the
    k agents updated before it. None where the records do not have it (runs before it was
    recorded)."""
    try:
        columns = sizes_by_position(stages)
    except ValueError:
        return None
    return [sum(v) / len(v) for v in columns]


def sizes_by_position(stages: list[dict[str, Any]]) -> list[list[float]]:
    """Every stage's ``updates[k].effective_sample_size``, gathered by update position k.
    ValueError where an update has none (records written before it was kept) or no stage has
    an update."""
    by_position: dict[int, list[float]] = {}
    for index, stage in enumerate(stages):
        for position, update in enumerate(stage["updates"]):
            if "effective_sample_size" not in update:
                raise ValueError(f"stage {index}, update {position}: no effective_sample_size")
            by_position.setdefault(position, []).append(float(update["effective_sample_size"]))
    if not by_position:
        raise ValueError("no stage has an update")
    return [sizes for _, sizes in sorted(by_position.items())]


def certificate_checks(stages: list[dict[str, Any]]) -> dict[str, float | None]:
    """Per stage followed by another: the measured change of the training reward (the next
    stage's first batch against this one's) against the stage certificate."""
    pairs = [
        (stage["certificate"], after["rollout_rewards"][0] - stage["rollout_rewards"][0])
        for stage, after in zip(stages, stages[1:], strict=False)
    ]
    if not pairs:
        return {"stages": 0.0, "held": None, "mean_certificate": None, "mean_change": None}
    return {
        "stages": float(len(pairs)),
        "held": sum(change >= certificate for certificate, change in pairs) / len(pairs),
        "mean_certificate": sum(c for c, _ in pairs) / len(pairs),
        "mean_change": sum(d for _, d in pairs) / len(pairs),
    }


def run_record(
    curve: dict[str, Any],
    stages: list[dict[str, Any]],
    untrained: dict[str, float],
    at_minutes: float = 8.0,
) -> dict[str, Any]:
    """One run: its scheme, δ and seed, last checkpoint, regressions and update shares."""
    scheme, radius, seed = parse_run(curve["run"])
    evaluations = [untrained] + [point["metrics"] for point in curve["curve"]]
    last = evaluations[-1]
    credit_curve = [(0.0, untrained["turn_credit"])] + [
        (point["budget_minutes"], point["metrics"]["turn_credit"]) for point in curve["curve"]
    ]
    return {
        "run": curve["run"],
        "scheme": scheme,
        "radius": radius,
        "seed": seed,
        # Each stage records its speaking order, one entry per agent: the team's size.
        "agents": len(stages[0]["order"]) if stages and "order" in stages[0] else None,
        "stages": len(stages),
        "checkpoints": len(curve["curve"]),
        "turn_credit": last["turn_credit"],
        "accuracy": held_out(last),
        "minutes": credit_curve[-1][0],
        "turn_credit_at_budget": value_at(credit_curve, at_minutes),
        "turn_credit_mean_to_budget": mean_until(credit_curve, at_minutes),
        "turn_credit_curve": credit_curve,
        "regressions_turn_credit": held_out_drops(evaluations, "turn_credit"),
        "regressions_accuracy": held_out_drops(evaluations, "accuracy"),
        "generated_tokens_per_stage": sum(s["generated_tokens"] for s in stages) / len(stages),
        "cpu_seconds_per_stage": sum(s["cpu_seconds"] for s in stages) / len(stages),
        "effective_sample_size_by_position": sample_size_by_position(stages),
        **{f"share_{k}": v for k, v in update_shares(stages, radius).items()},
        **{f"certificate_{k}": v for k, v in certificate_checks(stages).items()},
    }


def summarise(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """Per (scheme, δ): means (± standard error over seeds) of the runs' records."""
    groups: dict[tuple[str, float], list[dict[str, Any]]] = {}
    for run in runs:
        groups.setdefault((run["scheme"], run["radius"]), []).append(run)
    rows = []
    for (scheme, radius), members in sorted(
        groups.items(), key=lambda item: (item[0][1], item[0][0])
    ):
        row: dict[str, Any] = {"scheme": scheme, "radius": radius, "seeds": len(members)}
        for key in (
            "turn_credit",
            "accuracy",
            "minutes",
            "turn_credit_at_budget",
            "turn_credit_mean_to_budget",
            "regressions_turn_credit",
            "regressions_accuracy",
            "stages",
            "generated_tokens_per_stage",
            "cpu_seconds_per_stage",
            "share_backtracked",
            "share_near_radius",
            "share_rejected",
        ):
            row[key] = mean_and_error([float(m[key]) for m in members])
        sizes = [m["effective_sample_size_by_position"] for m in members]
        row["effective_sample_size_by_position"] = (
            [mean_and_error(list(column)) for column in zip(*sizes, strict=False)]
            if all(sizes)
            else None
        )
        row["certificates_held"] = [m["certificate_held"] for m in members]
        row["mean_certificate"] = [m["certificate_mean_certificate"] for m in members]
        rows.append(row)
    return {"rows": rows, "paired": paired_differences(runs), "runs": runs}


PAIRED_KEYS = ("turn_credit_at_budget", "turn_credit_mean_to_budget", "accuracy")
"""What ``paired_differences`` compares: turn credit at equal CPU, its mean over the CPU budget
(``run_records.mean_until``), final held-out accuracy."""


def paired_differences(runs: list[dict[str, Any]], baseline: str = "stale") -> list[dict[str, Any]]:
    """Per (scheme, δ) other than ``baseline``: scheme − baseline seed by seed, over the seeds
    both have. A paired difference removes what one seed's draw does to both runs (the same
    problems, the same stage-start batch), so its standard error is the spread of the
    differences over sqrt(pairs), not the two groups' errors combined."""
    value = {(r["scheme"], r["radius"], r["seed"]): r for r in runs}
    rows = []
    for scheme, radius in sorted(
        {(r["scheme"], r["radius"]) for r in runs if r["scheme"] != baseline},
        key=lambda item: (item[1], item[0]),
    ):
        seeds = sorted(
            s
            for (name, rad, s) in value
            if (name, rad) == (scheme, radius) and (baseline, radius, s) in value
        )
        if not seeds:
            continue
        row: dict[str, Any] = {
            "scheme": scheme,
            "baseline": baseline,
            "radius": radius,
            "seeds": seeds,
        }
        for key in PAIRED_KEYS:
            differences = [
                float(value[(scheme, radius, s)][key]) - float(value[(baseline, radius, s)][key])
                for s in seeds
            ]
            row[key] = mean_and_error(differences)
            row[f"{key}_differences"] = differences
            row[f"{key}_above"] = sum(d > 0 for d in differences)
        rows.append(row)
    return rows


def reweighted_rows(summary: dict[str, Any]) -> list[dict[str, Any]]:
    """HAPPO's rows whose records hold each update's effective sample size."""
    return [
        row
        for row in summary["rows"]
        if row["scheme"] == "happo" and row["effective_sample_size_by_position"] is not None
    ]


def stat_cell(stat: dict[str, float | None], digits: int, scale: float = 1.0) -> str:
    """``mean ± standard error`` at ``digits`` decimals (the mean alone with one seed)."""
    error = stat["standard_error"]
    text = f"{scale * stat['mean']:.{digits}f}"  # type: ignore[operator]
    return text if error is None else f"{text} ± {scale * error:.{digits}f}"


def markdown(summary: dict[str, Any]) -> str:
    lines = [
        "| δ | scheme | seeds | turn credit at the budget | final turn credit | final accuracy "
        "| at CPU-minutes | regressions per run (turn credit, accuracy) | stages | tokens / stage "
        "| CPU s / stage | updates backtracked | at ≥ δ/2 | rejected |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for row in summary["rows"]:
        lines.append(
            f"| {row['radius']:g} | {row['scheme']} | {row['seeds']} | "
            f"{stat_cell(row['turn_credit_at_budget'], 3)} | "
            f"{stat_cell(row['turn_credit'], 3)} | {stat_cell(row['accuracy'], 1, 100)}% | "
            f"{stat_cell(row['minutes'], 1)} | "
            f"{stat_cell(row['regressions_turn_credit'], 2)}, {stat_cell(row['regressions_accuracy'], 2)} | "
            f"{stat_cell(row['stages'], 1)} | {row['generated_tokens_per_stage']['mean']:.0f} | "
            f"{row['cpu_seconds_per_stage']['mean']:.0f} | "
            f"{100 * row['share_backtracked']['mean']:.0f}% | "
            f"{100 * row['share_near_radius']['mean']:.0f}% | "
            f"{100 * row['share_rejected']['mean']:.0f}% |"
        )
    if summary.get("paired"):
        lines += [
            "",
            "| δ | paired difference | seeds | turn credit at the budget | above on "
            "| final accuracy | above on |",
            "|---|---|---|---|---|---|---|",
        ]
        for row in summary["paired"]:
            n = len(row["seeds"])
            lines.append(
                f"| {row['radius']:g} | {row['scheme']} − {row['baseline']} | {n} | "
                f"{stat_cell(row['turn_credit_at_budget'], 3)} | "
                f"{row['turn_credit_at_budget_above']} of {n} | "
                f"{stat_cell(row['accuracy'], 1, 100)} points | {row['accuracy_above']} of {n} |"
            )
    weighted = reweighted_rows(summary)
    if weighted:
        positions = max(len(row["effective_sample_size_by_position"]) for row in weighted)
        lines += [
            "",
            "| δ | scheme | seeds | "
            + " | ".join(f"ESS, update {k + 1}" for k in range(positions))
            + " |",
            "|---|---|---|" + "---|" * positions,
        ]
        for row in weighted:
            cells = [stat_cell(stat, 2) for stat in row["effective_sample_size_by_position"]]
            lines.append(
                f"| {row['radius']:g} | {row['scheme']} | {row['seeds']} | "
                + " | ".join(cells)
                + " |"
            )
    return "\n".join(lines)


def team_name(summary: dict[str, Any]) -> str:
    """The figure's name for the team: the "8-agent relay chain" where every run has 8 agents,
    else the sizes the runs recorded."""
    sizes = sorted({run.get("agents") or 0 for run in summary["runs"]})
    if len(sizes) == 1 and sizes[0]:
        return f"{sizes[0]}-agent relay chain"
    known = [str(size) for size in sizes if size]
    return f"relay chain ({', '.join(known) or 'unknown'} agents)"


def plot(summary: dict[str, Any], destination: Path, at_minutes: float = 8.0) -> Path:
    """Final turn credit and regressions per run against δ, one line per scheme (mean ± s.e.,
    dots: seeds); the held-out curves beside them."""
    from studies.figures import plt, save_figure

    weighted = reweighted_rows(summary)
    panels = 4 if weighted else 3
    figure, axes_row = plt.subplots(1, panels, figsize=(5 * panels, 4.2))
    credit, drops, curves = axes_row[:3]
    schemes = sorted({row["scheme"] for row in summary["rows"]})
    for index, scheme in enumerate(schemes):
        colour = f"C{index}"
        rows = [row for row in summary["rows"] if row["scheme"] == scheme]
        radii = [row["radius"] for row in rows]
        for axes, key in ((credit, "turn_credit_at_budget"), (drops, "regressions_turn_credit")):
            means = [row[key]["mean"] for row in rows]
            errors = [row[key]["standard_error"] or 0.0 for row in rows]
            axes.errorbar(
                radii, means, yerr=errors, marker="o", color=colour, capsize=3, label=scheme
            )
        for run in summary["runs"]:
            if run["scheme"] != scheme:
                continue
            credit.plot(
                [run["radius"]], [run["turn_credit_at_budget"]], ".", color=colour, alpha=0.5
            )
            style = "o-" if run["radius"] == max(radii) else "o:"
            minutes, values = zip(*run["turn_credit_curve"], strict=True)
            curves.plot(minutes, values, style, color=colour, alpha=0.7, markersize=3)
    curves.axvline(at_minutes, color="grey", linewidth=0.8, linestyle="--")
    for axes in (credit, drops):
        axes.set_xscale("log")
        axes.set_xlabel("δ, nats per turn (trust-region radius)")
        axes.legend()
    credit.set_ylabel("held-out turn credit at the CPU budget")
    drops.set_ylabel("regressions per run (turn credit)")
    curves.set_xlabel("training CPU minutes (evaluations excluded)")
    curves.set_ylabel("held-out turn credit")
    curves.set_title("solid: the largest δ, dotted: the others", fontsize=9)
    if weighted:
        sizes = axes_row[3]
        for row in weighted:
            stats = row["effective_sample_size_by_position"]
            positions = range(1, len(stats) + 1)
            sizes.errorbar(
                positions,
                [stat["mean"] for stat in stats],
                yerr=[stat["standard_error"] or 0.0 for stat in stats],
                marker="o",
                capsize=3,
                label=f"δ = {row['radius']:g}",
            )
        sizes.set_xticks(
            range(1, max(len(r["effective_sample_size_by_position"]) for r in weighted) + 1)
        )
        sizes.set_ylim(0, 1.05)
        sizes.set_xlabel("update within the stage (HAPPO)")
        sizes.set_ylabel("effective sample size / batch")
        sizes.set_title("(Σw)² / (N Σw²) of the reweighted batch", fontsize=9)
        sizes.legend()
    figure.suptitle(f"{team_name(summary)}: stale against TeamTR at equal CPU, by step size")
    return save_figure(figure, destination)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--curves", type=Path, required=True, help="checkpoint_curves results")
    parser.add_argument("--metrics", type=Path, required=True, help="folder of <run>.jsonl")
    parser.add_argument("--untrained", type=Path, required=True, help="untrained evaluation")
    parser.add_argument("--json", type=Path, help="write the summary here")
    parser.add_argument("--plot", type=Path, help="write the figure here")
    parser.add_argument("--markdown", action="store_true", help="print the table")
    parser.add_argument(
        "--at", type=float, default=8.0, help="training CPU-minutes of the equal-CPU comparison"
    )
    args = parser.parse_args(argv)
    untrained = json.loads(args.untrained.read_text())
    runs = []
    for path in sorted(args.curves.glob("*.json")):
        curve = json.loads(path.read_text())
        metrics = args.metrics / f"{curve['run']}.jsonl"
        if not metrics.is_file():
            print(f"{curve['run']}: no {metrics}; skipped", file=sys.stderr)
            continue
        stages = [json.loads(line) for line in metrics.read_text().splitlines()]
        runs.append(run_record(curve, stages, untrained, args.at))
    if not runs:
        print(
            f"no runs with curves in {args.curves} and metrics in {args.metrics}", file=sys.stderr
        )
        return 2
    summary = summarise(runs)
    if args.json:
        args.json.write_text(json.dumps(summary, indent=1) + "\n")
    if args.plot:
        plot(summary, args.plot, args.at)
    if args.markdown:
        print(markdown(summary))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
