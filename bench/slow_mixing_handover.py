"""Benchmark: what ``sim.evaluate`` saves by never factorising a random MDP.

When Richardson iteration contracts slowly, ``sim.linear`` hands a small, banded kernel (rings,
grids) to a sparse LU and anything else to GMRES: the choice is made from the kernel's
structure, because a random MDP's LU fills in. This script forces every Richardson window to
look slow (``RICHARDSON_SLOW_RATE = 0``, as ``tests/sim/test_evaluate.py`` does) and times, side
by side in one run on the same random MDP, the automatic choice (GMRES) against the sparse LU it
avoids (``method="direct-lu"``), and prints their ratio and both residuals.

    python bench/slow_mixing_handover.py                 # S = 8000, the test's MDP
    python bench/slow_mixing_handover.py --states 4000   # a quicker run (LU / GMRES ~ 250)

Below S = 3162 (S times a random MDP's bandwidth ~ S at most ``SLOW_MIXING_DIRECT_MAX_FILL``)
the LU is affordable and the automatic choice is the LU itself (a ratio of 1).
"""

from __future__ import annotations

import argparse
import time

import numpy as np

import sim
import sim.linear


def timed(mdp: sim.TurnTakingMDP, method: str) -> tuple[float, sim.Evaluation]:
    start = time.perf_counter()
    result = sim.evaluate(mdp, sim.uniform_team(mdp), method=method)
    return time.perf_counter() - start, result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--states", type=int, default=8_000, help="S of the random MDP")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)

    mdp = sim.random_mdp(args.states, 4, 3, gamma=0.99, seed=args.seed)
    sim.linear.RICHARDSON_SLOW_RATE = 0.0  # every window looks slow
    auto_seconds, auto = timed(mdp, "auto")
    lu_seconds, lu = timed(mdp, "direct-lu")
    gap = float(np.max(np.abs(auto.V - lu.V)) / np.max(np.abs(lu.V)))
    print(f"random MDP, S = {args.states}, gamma = 0.99, every Richardson window slow")
    print(f"auto        {auto.method:13s} {auto_seconds:9.3f} s  residual {auto.residual:.1e}")
    print(f"direct-lu   {lu.method:13s} {lu_seconds:9.3f} s  residual {lu.residual:.1e}")
    print(
        f"LU / auto time ratio {lu_seconds / auto_seconds:.1f}; max |V_auto - V_lu| / max |V| {gap:.1e}"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
