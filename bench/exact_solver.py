"""Benchmark: exact policy evaluation (``sim.evaluate``) against value iteration and dense solves.

For each family (random MDPs with ~4 successors per state-action, and trees) and each size S,
one run times:

* ``sim.evaluate``: V, Q, A and the occupancy d (deflated Krylov or triangular solves);
* value iteration (iterative policy evaluation, what users write by hand) of V and of d, run
  until both relative residuals are as small as the ones ``sim.evaluate`` reached;
* ``numpy.linalg.solve`` on the dense S x S systems, where they fit (S <= --dense-max-states).

It prints the times, their ratios, the relative residuals ||b - M x|| / ||b|| of every method,
and the fitted growth exponent of the evaluate time against nnz(P).

    python bench/exact_solver.py                      # S = 1e3 .. 1e6
    python bench/exact_solver.py --max-states 10000   # a quick run
"""

from __future__ import annotations

import argparse
import time
from dataclasses import dataclass

import numpy as np

import sim
from sim.linear import relative_residual


@dataclass
class Row:
    family: str
    n_states: int
    nnz: int
    method: str
    evaluate_seconds: float
    evaluate_residual: float
    vi_seconds: float | None = None
    vi_iterations: int | None = None
    vi_residual: float | None = None
    dense_seconds: float | None = None
    dense_residual: float | None = None
    agreement: float | None = None
    """max |V_evaluate - V_reference| / max |V_reference| (value iteration, or dense)."""


def value_iteration(
    kernel, gamma: float, reward: np.ndarray, start: np.ndarray, target: float, max_iter: int
) -> tuple[np.ndarray, np.ndarray, int, float]:
    """V <- r + gamma K V and d <- (1-gamma) rho0 + gamma K^T d until both residuals <= target.

    The change of an iterate is exactly its residual, so the stopping test costs nothing.
    """
    transpose = kernel.T
    values = np.zeros_like(reward)
    occupancy = np.zeros_like(start)
    source = (1.0 - gamma) * start
    reward_norm, source_norm = np.linalg.norm(reward), np.linalg.norm(source)
    residual = np.inf
    for iteration in range(1, max_iter + 1):
        new_values = reward + gamma * (kernel @ values)
        new_occupancy = source + gamma * (transpose @ occupancy)
        residual = max(
            np.linalg.norm(new_values - values) / reward_norm,
            np.linalg.norm(new_occupancy - occupancy) / source_norm,
        )
        values, occupancy = new_values, new_occupancy
        if residual <= target:
            return values, occupancy, iteration, residual
    return values, occupancy, max_iter, residual


def build(family: str, n_states: int, gamma: float, seed: int) -> sim.TurnTakingMDP:
    if family == "random":
        return sim.random_mdp(n_states, 4, 4, gamma=gamma, seed=seed, successors=4)
    return sim.tree_mdp(n_states, n_actions=4, n_agents=4, gamma=gamma, seed=seed, branching=4)


def measure(family: str, n_states: int, args: argparse.Namespace) -> Row:
    mdp = build(family, n_states, args.gamma, args.seed)
    pi = sim.random_team(mdp, args.seed).table
    started = time.perf_counter()
    result = sim.evaluate(mdp, pi)
    row = Row(
        family,
        n_states,
        mdp.P.nnz,
        result.method,
        time.perf_counter() - started,
        result.residual,
    )
    kernel = sim.policy_kernel(mdp, pi)
    reward = np.einsum("sa,sa->s", pi, mdp.R)
    gamma = mdp.gamma
    reference = None
    if not args.skip_value_iteration:
        started = time.perf_counter()
        values, occupancy, iterations, _ = value_iteration(
            kernel, gamma, reward, mdp.rho0, max(result.residual, 1e-13), args.max_vi_iterations
        )
        row.vi_seconds = time.perf_counter() - started
        row.vi_iterations = iterations
        row.vi_residual = _residual(kernel, gamma, values, occupancy, reward, mdp.rho0)
        reference = values
    if n_states <= args.dense_max_states:
        started = time.perf_counter()
        dense = np.eye(n_states) - gamma * kernel.toarray()
        values = np.linalg.solve(dense, reward)
        occupancy = np.linalg.solve(dense.T, (1.0 - gamma) * mdp.rho0)
        row.dense_seconds = time.perf_counter() - started
        row.dense_residual = _residual(kernel, gamma, values, occupancy, reward, mdp.rho0)
        reference = values
    if reference is not None:
        row.agreement = float(np.abs(result.V - reference).max() / np.abs(reference).max())
    return row


def _residual(kernel, gamma, values, occupancy, reward, start) -> float:
    transpose = kernel.T
    return max(
        relative_residual(lambda v: v - gamma * (kernel @ v), values, reward),
        relative_residual(lambda v: v - gamma * (transpose @ v), occupancy, (1 - gamma) * start),
    )


def _fmt(value: float | None, spec: str) -> str:
    return "-" if value is None else format(value, spec)


def print_table(rows: list[Row], gamma: float) -> None:
    header = (
        f"{'family':<7} {'S':>9} {'nnz(P)':>10} {'method':<18} {'evaluate s':>10} "
        f"{'resid':>8} {'VI s':>8} {'VI iters':>8} {'VI resid':>8} {'VI/eval':>8} "
        f"{'dense s':>8} {'dense/eval':>10} {'max dV':>8}"
    )
    print(f"gamma = {gamma}; relative residuals ||b - M x|| / ||b|| of both V and d systems")
    print(header)
    print("-" * len(header))
    for row in rows:
        vi_ratio = None if row.vi_seconds is None else row.vi_seconds / row.evaluate_seconds
        dense_ratio = (
            None if row.dense_seconds is None else row.dense_seconds / row.evaluate_seconds
        )
        print(
            f"{row.family:<7} {row.n_states:>9d} {row.nnz:>10d} {row.method:<18} "
            f"{row.evaluate_seconds:>10.3f} {row.evaluate_residual:>8.1e} "
            f"{_fmt(row.vi_seconds, '8.2f'):>8} {_fmt(row.vi_iterations, 'd'):>8} "
            f"{_fmt(row.vi_residual, '8.1e'):>8} {_fmt(vi_ratio, '7.1f') + 'x' if vi_ratio else '-':>8} "
            f"{_fmt(row.dense_seconds, '8.3f'):>8} "
            f"{_fmt(dense_ratio, '9.1f') + 'x' if dense_ratio else '-':>10} "
            f"{_fmt(row.agreement, '8.1e'):>8}"
        )
    for family in sorted({row.family for row in rows}):
        chosen = [row for row in rows if row.family == family]
        if len(chosen) >= 2:
            slope = np.polyfit(
                np.log([row.nnz for row in chosen]),
                np.log([row.evaluate_seconds for row in chosen]),
                1,
            )[0]
            print(f"{family}: evaluate time ~ nnz(P)^{slope:.2f} (least squares on log-log)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--max-states", type=int, default=1_000_000, help="largest S to run")
    parser.add_argument("--gamma", type=float, default=0.95, help="discount factor gamma")
    parser.add_argument("--seed", type=int, default=0, help="seed of the MDPs and the teams")
    parser.add_argument("--families", default="random,tree", help="comma-separated families")
    parser.add_argument(
        "--dense-max-states", type=int, default=4000, help="largest S for numpy.linalg.solve"
    )
    parser.add_argument(
        "--max-vi-iterations", type=int, default=100_000, help="cap on value iteration sweeps"
    )
    parser.add_argument(
        "--skip-value-iteration", action="store_true", help="time sim.evaluate (and dense) only"
    )
    args = parser.parse_args()
    sizes = [n for n in (1_000, 10_000, 100_000, 1_000_000) if n <= args.max_states]
    rows = []
    for family in args.families.split(","):
        for n_states in sizes:
            rows.append(measure(family, n_states, args))
            print(f"  done: {family} S={n_states}", flush=True)
    print_table(rows, args.gamma)


if __name__ == "__main__":
    main()
