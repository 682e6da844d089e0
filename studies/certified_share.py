"""How often each bound of ``teamtr.measured`` certifies a gaining update, and how often it is
wrong, on pairs whose distribution is known exactly.

The pairs: D in {-1, 0, +1} with probabilities 0.05 / 0.80 / 0.15 (mean +0.10, width w = 1):
an update that usually changes nothing, sometimes wins and rarely loses, the shape of a relay
update's held-out pairs. For each n, ``--repeats`` draws of n pairs; every bound is computed on
the same draws (a paired comparison). Per bound: the share of draws certified (bound > 0), the
share whose bound exceeds the true mean (a violation: at most alpha for a valid bound), and the
mean bound, each share with its binomial standard error.

``--sequential BATCH CAP`` adds sequential draws (``teamtr.measured.sequential_measure``):
BATCH pairs, then BATCH more at a time until the anytime bound clears 0, cannot within CAP (by
each ``--futility`` rule asked for, on the same draws), or CAP pairs are drawn; per run the
pairs drawn, why it stopped and whether it certified. ``--probabilities P- P0 P+`` draws the
pairs from another three-point distribution (an update that gains less, or nothing).

``python -m studies.certified_share --json results/certificate/certified_share.json`` writes
the table of docs/measured_certificate.md ("Which bound").
"""

from __future__ import annotations

import argparse
import itertools
import json
import math
import sys
from pathlib import Path

import numpy as np

from teamtr.measured import (
    ANYTIME,
    BOUNDS,
    FUTILITY_RULES,
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
    parser.add_argument(
        "--futility",
        choices=FUTILITY_RULES,
        action="append",
        default=None,
        help="the sequential draws' futility rule (repeatable; default: trend)",
    )
    parser.add_argument(
        "--probabilities",
        type=float,
        nargs=3,
        metavar=("P_MINUS", "P_ZERO", "P_PLUS"),
        default=PROBABILITIES.tolist(),
        help="P(D = -1), P(D = 0), P(D = +1) (default: 0.05 0.80 0.15, mean +0.10)",
    )
    parser.add_argument("--json", type=Path, default=None, help="write the results here")
    return parser


def draws(n: int, repeats: int, seed: int, probabilities: np.ndarray = PROBABILITIES) -> np.ndarray:
    """``repeats`` rows of n pairs, from the generator seeded (seed, n)."""
    rng = np.random.default_rng([seed, n])
    return rng.choice(VALUES, size=(repeats, n), p=probabilities)


def share(events: np.ndarray) -> dict[str, float]:
    """A share and its binomial standard error."""
    p = float(events.mean())
    return {"share": p, "se": math.sqrt(p * (1 - p) / events.size)}


def row(
    n: int, repeats: int, alpha: float, seed: int, probabilities: np.ndarray = PROBABILITIES
) -> dict[str, dict[str, object]]:
    """Every bound of ``METHODS`` on the same draws of n pairs."""
    pairs = draws(n, repeats, seed, probabilities)
    true_mean = float(VALUES @ probabilities)
    result: dict[str, dict[str, object]] = {}
    for method in METHODS:
        bounds = np.array([lower_bound(d, WIDTH, alpha, method) for d in pairs])
        result[method] = {
            "certified": share(bounds > 0),
            "violation": share(bounds > true_mean),
            "mean_bound": float(bounds.mean()),
        }
    return result


def sequential_row(
    batch: int,
    cap: int,
    repeats: int,
    alpha: float,
    seed: int,
    futility: str = "trend",
    probabilities: np.ndarray = PROBABILITIES,
) -> dict[str, object]:
    """``repeats`` sequential measurements, each from its own generator (seed, batch, cap, r):
    the same draws for every futility rule."""
    certified, violated, pairs, stops = [], [], [], []
    true_mean = float(VALUES @ probabilities)
    for r in range(repeats):
        rng = np.random.default_rng([seed, batch, cap, r])

        def draw(count: int, rng: np.random.Generator = rng) -> PairedDifferences:
            return PairedDifferences(rng.choice(VALUES, size=count, p=probabilities), WIDTH)

        certificate = sequential_measure(draw(batch), draw, 1.0 - alpha, batch, cap, futility)
        certified.append(certificate.bound > 0)
        violated.append(certificate.bound > true_mean)
        pairs.append(certificate.n)
        stops.append(certificate.stop)
    return {
        "batch": batch,
        "cap": cap,
        "futility": futility,
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
    if min(args.probabilities) < 0 or abs(sum(args.probabilities) - 1) > 1e-9:
        return f"--probabilities must be >= 0 and sum to 1, got {args.probabilities}"
    return None


def run(args: argparse.Namespace) -> int:
    message = problem(args)
    if message is not None:
        print(f"certified_share: {message}", file=sys.stderr)
        return 2
    probabilities = np.array(args.probabilities)
    rows = {str(n): row(n, args.repeats, args.alpha, args.seed, probabilities) for n in args.sizes}
    document: dict[str, object] = {
        "values": VALUES.tolist(),
        "probabilities": probabilities.tolist(),
        "true_mean": float(VALUES @ probabilities),
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
    for (batch, cap), futility in itertools.product(
        args.sequential or [], args.futility or ["trend"]
    ):
        sequential = sequential_row(
            batch, cap, args.repeats, args.alpha, args.seed, futility, probabilities
        )
        sequential_rows.append(sequential)
        certified, violation = sequential["certified"], sequential["violation"]
        assert isinstance(certified, dict) and isinstance(violation, dict)
        print(
            f"sequential ({futility}), {batch} a batch up to {cap}: certified "
            f"{certified['share']:.3f} "
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
