"""Where a training run's CPU goes when it measures its updates: the held-out pairs' plays
against the training draws', turn by turn (docs/measured_certificate.md, "Bigger draws").

Runs ``teamtr train`` in this process under ``llm.common.profiling.recording()`` with the
arguments given after ``--``, and reports for the held-out plays (sections under the
``"held-out "`` prefix: fresh groups, the chain's continuations, sequential draws) and for the
training draws the CPU seconds and the number of plays of each turn (one ``generate`` call a
turn of a play, whatever its rows), with the run's pairs from its ``metrics.jsonl``. A play's
decoding steps cost the same whatever its rows (``bench/held_out_play_cost.py``'s fixed part),
so plays of few rows cost more a pair.

Usage: ``OMP_NUM_THREADS=1 .venv/bin/python bench/held_out_profile.py --json out.json --
--config default --seed 0 --name p --output-dir /tmp/p --set run.threads=1 --set
stage.stages=2 --set stage.certificate_groups=32 --set stage.certificate_batch=32``
(``--quick``: the smoke config's tiny model with 4 held-out groups, seconds).
"""

from __future__ import annotations

import argparse
import json
import tempfile
from pathlib import Path
from typing import Any

from llm.common import profiling
from llm.sampling.sampler import HELD_OUT
from studies.llm.certificate.measured_table import measured_updates, read_stages
from teamtr.cli import main as teamtr_main

QUICK = ["--config", "smoke.toml", "--set", "stage.certificate_groups=4", "--no-progress"]
TURN_SECTION = "sampling turn "


def turn_parts(parts: dict[str, dict[str, float]], prefix: str) -> dict[str, dict[str, float]]:
    """The profile's ``prefix + "sampling turn t"`` sections, by t: CPU seconds and calls."""
    found = {}
    for name, part in parts.items():
        if name.startswith(prefix + TURN_SECTION):
            turn = name.removeprefix(prefix + TURN_SECTION)
            found[turn] = {"cpu_seconds": part["cpu_seconds"], "plays": part["calls"]}
    return dict(sorted(found.items()))


def summary(profile: dict[str, Any], metrics: Path) -> dict[str, Any]:
    """The held-out and training plays of a recorded run, and its pairs."""
    parts = profile["parts"]
    held_out = turn_parts(parts, HELD_OUT)
    training = turn_parts(parts, "")
    pairs = [update["measured"]["n"] for update in measured_updates(read_stages(metrics))]
    held_out_cpu = sum(p["cpu_seconds"] for p in held_out.values())
    held_out_plays = sum(p["plays"] for p in held_out.values())
    return {
        "total_cpu_seconds": profile["total_cpu_seconds"],
        "held_out_turns": held_out,
        "training_turns": training,
        "held_out_cpu_seconds": held_out_cpu,
        "held_out_plays": held_out_plays,
        "cpu_per_held_out_play": held_out_cpu / held_out_plays if held_out_plays else None,
        "pairs": pairs,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="the smoke config's tiny model")
    parser.add_argument("--json", type=Path, default=None)
    parser.add_argument("train", nargs="*", help="teamtr train's arguments (after --)")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as scratch:
        train = list(args.train)
        if args.quick:
            where = [] if "--output-dir" in train else ["--output-dir", scratch]
            train = QUICK + ([] if "--name" in train else ["--name", "quick"]) + where + train
        if "--name" not in train or "--output-dir" not in train:
            parser.error("give teamtr train a --name and an --output-dir (to read its metrics)")
        with profiling.recording() as profile:
            code = teamtr_main(["train", *train])
        if code != 0:
            return code
        run_dir = Path(train[train.index("--output-dir") + 1]) / train[train.index("--name") + 1]
        report = summary(profile.to_dict(), run_dir / "metrics.jsonl")
    for label, turns in (
        ("held out", report["held_out_turns"]),
        ("training", report["training_turns"]),
    ):
        for turn, part in turns.items():
            print(f"{label}, turn {turn}: {part['plays']} plays, {part['cpu_seconds']:.1f} CPU-s")
    print(
        f"held out: {report['held_out_cpu_seconds']:.1f} CPU-s in {report['held_out_plays']} "
        f"turn-plays for {sum(report['pairs'])} pairs, of {report['total_cpu_seconds']:.1f} in all"
    )
    if args.json is not None:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(report, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
