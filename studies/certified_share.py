"""How often each bound of ``teamtr.measured`` certifies a gaining update, and how often it is
wrong, on pairs whose distribution is known exactly.

The pairs: D in {-1, 0, +1} with probabilities 0.05 / 0.80 / 0.15 (mean +0.10, width w = 1):
an update that usually changes nothing, sometimes wins and rarely loses, the shape of a relay
update's held-out pairs. For each n, ``--repeats`` draws of n pairs; every bound is computed on
the same draws (a paired comparison). Per bound: the share of draws certified (bound > 0), the
share whose bound exceeds the true mean (a violation: at most alpha for a valid bound), and the
mean bound, each share with its binomial standard error.

``--sequential BATCH CAP`` adds sequential draws (``teamtr.measured.sequential_measure``):
BATCH pairs, then BATCH more at a time until the anytime bound clears 0, cannot within CAP, or
CAP pairs are drawn; per run the pairs drawn, why it stopped and whether it certified.

``python -m studies.certified_share --json results/certificate/certified_share.json`` writes
the table of docs/measured_certificate.md ("Which bound").
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path

import numpy as np

from teamtr.measured import (
    ANYTIME,
    BOUNDS,
    STOPS,
    PairedDifferences,
    lower_bound,
    sequential_measure,
)

VALUES = np.array([-1.0, 0.0, 1.0])
PROBABILITIES = np.array([0.05, 0.80, 0.15])
WIDTH = 1.0
TRUE_MEAN = float(VALUES @ PROBABILITIES)
METHODS = ("betting", "hedged", "bernstein", ANYTIME)
"""Before (``betting``, the former default) and after (``hedged``), then the others."""


def build_parser(prog: str = "python -m studies.certified_share") -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog=prog, description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[32, 64, 128], help="n pairs")
    parser.add_argument("--repeats", type=int, default=2000, help="draws of n pairs per size")
    parser.add_argument("--alpha", type=float, default=0.05, help="1 - level of every bound")
    parser.add_argument("--seed", type=int, default=0, help="size n draws from seed (seed, n)")
    parser.add_argument(
        "--sequential",
        type=int,
        nargs=2,
        metavar=("BATCH", "CAP"),
        action="append",
        default=None,
        help="also draw pairs sequentially, BATCH at a time up to CAP (repeatable)",
    )
    parser.add_argument("--json", type=Path, default=None, help="write the results here")
    return parser


def draws(n: int, repeats: int, seed: int) -> np.ndarray:
    """``repeats`` rows of n pairs, from the generator seeded (seed, n)."""
    rng = np.random.default_rng([seed, n])
    return rng.choice(VALUES, size=(repeats, n), p=PROBABILITIES)


def share(events: np.ndarray) -> dict[str, float]:
    """A share and its binomial standard error."""
    p = float(events.mean())
    return {"share": p, "se": math.sqrt(p * (1 - p) / events.size)}


def row(n: int, repeats: int, alpha: float, seed: int) -> dict[str, dict[str, object]]:
    """Every bound of ``METHODS`` on the same draws of n pairs."""
    pairs = draws(n, repeats, seed)
    result: dict[str, dict[str, object]] = {}
    for method in METHODS:
        bounds = np.array([lower_bound(d, WIDTH, alpha, method) for d in pairs])
        result[method] = {
            "certified": share(bounds > 0),
            "violation": share(bounds > TRUE_MEAN),
            "mean_bound": float(bounds.mean()),
        }
    return result


def sequential_row(
    batch: int, cap: int, repeats: int, alpha: float, seed: int
) -> dict[str, object]:
    """``repeats`` sequential measurements, each from its own generator (seed, batch, cap, r)."""
    certified, violated, pairs, stops = [], [], [], []
    for r in range(repeats):
        rng = np.random.default_rng([seed, batch, cap, r])

        def draw(count: int, rng: np.random.Generator = rng) -> PairedDifferences:
            return PairedDifferences(rng.choice(VALUES, size=count, p=PROBABILITIES), WIDTH)

        certificate = sequential_measure(draw(batch), draw, 1.0 - alpha, batch, cap)
        certified.append(certificate.bound > 0)
        violated.append(certificate.bound > TRUE_MEAN)
        pairs.append(certificate.n)
        stops.append(certificate.stop)
    return {
        "batch": batch,
        "cap": cap,
        "certified": share(np.array(certified)),
        "violation": share(np.array(violated)),
        "mean_pairs": float(np.mean(pairs)),
        "median_pairs": float(np.median(pairs)),
        "stops": {stop: stops.count(stop) for stop in STOPS},
    }


def problem(args: argparse.Namespace) -> str | None:
    if any(n < 1 for n in args.sizes):
        return f"--sizes: every n must be >= 1, got {args.sizes}"
    if args.repeats < 1:
        return f"--repeats must be >= 1, got {args.repeats}"
    if not 0 < args.alpha < 1:
        return f"--alpha must lie in (0, 1), got {args.alpha}"
    for batch, cap in args.sequential or []:
        if not 1 <= batch <= cap:
            return f"--sequential: need 1 <= BATCH <= CAP, got {batch} {cap}"
    if not 0 <= args.seed < 2**31:
        return f"--seed must lie in 0 .. 2**31 - 1, got {args.seed}"
    return None


def run(args: argparse.Namespace) -> int:
    message = problem(args)
    if message is not None:
        print(f"certified_share: {message}", file=sys.stderr)
        return 2
    rows = {str(n): row(n, args.repeats, args.alpha, args.seed) for n in args.sizes}
    document: dict[str, object] = {
        "values": VALUES.tolist(),
        "probabilities": PROBABILITIES.tolist(),
        "true_mean": TRUE_MEAN,
        "width": WIDTH,
        "alpha": args.alpha,
        "repeats": args.repeats,
        "seed": args.seed,
        "bounds": list(BOUNDS) + [ANYTIME],
        "rows": rows,
    }
    print("| n | bound | certified > 0 | bound > true mean | mean bound |")
    print("|---|---|---|---|---|")
    for n, by_method in rows.items():
        for method, cells in by_method.items():
            certified, violation = cells["certified"], cells["violation"]
            assert isinstance(certified, dict) and isinstance(violation, dict)
            print(
                f"| {n} | {method} | {certified['share']:.3f} ± {certified['se']:.3f} "
                f"| {violation['share']:.4f} ± {violation['se']:.4f} "
                f"| {cells['mean_bound']:+.3f} |"
            )
    sequential_rows: list[dict[str, object]] = []
    document["sequential"] = sequential_rows
    for batch, cap in args.sequential or []:
        sequential = sequential_row(batch, cap, args.repeats, args.alpha, args.seed)
        sequential_rows.append(sequential)
        certified, violation = sequential["certified"], sequential["violation"]
        assert isinstance(certified, dict) and isinstance(violation, dict)
        print(
            f"sequential, {batch} a batch up to {cap}: certified {certified['share']:.3f} "
            f"± {certified['se']:.3f}, bound > true mean {violation['share']:.4f}, pairs "
            f"{sequential['mean_pairs']:.0f} on average (median {sequential['median_pairs']:.0f})"
            f", stops {sequential['stops']}"
        )
    if args.json is not None:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(document, indent=1) + "\n")
    return 0


def main(argv: list[str] | None = None) -> int:
    return run(build_parser().parse_args(argv))


if __name__ == "__main__":
    raise SystemExit(main())
