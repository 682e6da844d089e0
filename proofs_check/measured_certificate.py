"""The measured certificate against the exact improvement, over many seeded TeamTR runs.

Each run trains a team with ``SampledSampler`` episodes and ``ExactUpdater`` under the teamtr
scheme, holding out episodes for the measured certificate (``teamtr.measured``); J is exact
(``sim.evaluate``), so every measured update's bound can be checked against its true
improvement J(pi_hat^i) - J(pi_hat^{i-1}). Beside the certificate, two bounds that should fail
the check, so that the check is seen to have power:

* ``training``: the same bound on the episodes the update was trained on, continued by the new
  team (the pairs the held-out groups replace);
* ``normal``: the normal approximation mean - z sd / sqrt(n) on the first ``tiny`` held-out
  pairs, valid only as n grows.

``python -m proofs_check.measured_certificate`` prints the table the tests assert on.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from statistics import NormalDist

import numpy as np

from sim.dialogue import dialogue_mdp
from sim.evaluate import evaluate
from sim.generators import random_mdp
from sim.mdp import TurnTakingMDP
from sim.rollouts import SampledSampler
from sim.team import as_fitting_team, uniform_team
from sim.updates import ExactUpdater
from teamtr.config import StageConfig
from teamtr.measured import lower_bound, pairs_to_certify
from teamtr.protocols import TeamPolicy
from teamtr.stage import run_stages


def dialogue_family(n_agents: int, seed: int) -> TurnTakingMDP:
    """Episodic, reward on the answer: the language-model case in miniature."""
    return dialogue_mdp(n_agents, vocab_size=2, message_length=2, n_turns=n_agents + 1, seed=seed)


def discounted_family(n_agents: int, seed: int) -> TurnTakingMDP:
    """Discounted, geometric termination (the last-step estimate of ``sim.pairing``)."""
    return random_mdp(12, 3, n_agents, gamma=0.7, seed=seed)


FAMILIES: dict[str, Callable[[int, int], TurnTakingMDP]] = {
    "dialogue": dialogue_family,
    "discounted": discounted_family,
}


BOUND_NAMES = ("hedged", "betting", "bernstein", "training", "normal")
"""The certificate's three bounds on the held-out pairs (the first, the default, is the one
the stage records), then the two twins (module docstring)."""


@dataclass(frozen=True)
class MeasuredUpdate:
    """One measured update of a run, with its exact improvement."""

    gain: float
    """J(pi_hat^i) - J(pi_hat^{i-1}), exact."""
    bounds: dict[str, float]
    """Each of ``BOUND_NAMES``: a lower bound on ``gain`` at the run's level."""
    held_out_mean: float
    training_mean: float
    held_out_sd: float
    """The standard deviation of the held-out pairs."""
    reward_width: float
    n: int
    """Pairs drawn (sequential draws: as many as the rule took)."""


@dataclass(frozen=True)
class Settings:
    family: str = "dialogue"
    n_agents: int = 3
    seeds: int = 50
    held_out: int = 32
    train_episodes: int = 20
    radius: float = 0.05
    stages: int = 2
    level: float = 0.95
    tiny: int = 2
    batch: int = 0
    """``StageConfig.certificate_batch``: > 0 draws pairs on after the held-out ones."""
    cap: int = 512
    coupled: bool = False
    """Held-out episodes continued with common random numbers (``sim.coupling``)."""


def measured_updates(settings: Settings) -> Iterator[MeasuredUpdate]:
    """Every measured update of ``settings.seeds`` seeded runs, random order per stage."""
    alpha = 1.0 - settings.level
    z = NormalDist().inv_cdf(settings.level)
    for seed in range(settings.seeds):
        mdp = FAMILIES[settings.family](settings.n_agents, seed)
        sampler = SampledSampler(
            mdp, n_episodes=settings.train_episodes, seed=seed, coupled=settings.coupled
        )
        config = StageConfig(
            radius=settings.radius,
            order="random",
            seed=seed,
            certificate_groups=settings.held_out,
            certificate_level=settings.level,
            certificate_batch=settings.batch,
            certificate_cap=settings.cap,
        )

        def value(team: TeamPolicy, mdp: TurnTakingMDP = mdp) -> float:
            return evaluate(mdp, as_fitting_team(mdp, team, "measured_updates").table).J

        runs = run_stages(
            uniform_team(mdp),
            sampler,
            ExactUpdater(mdp),
            config,
            mdp.penalty_model(),
            settings.stages,
            evaluator=value,
        )
        for report, _ in runs:
            for record in report.records:
                measured, gain = record.measured, record.realised_gain
                if measured is None or gain is None or measured.differences is None:
                    continue
                new_team = record.base.with_agent(record.agent, record.update.policy)
                training = sampler.paired_differences(
                    record.rollouts.episodes, new_team, record.agent
                ).differences
                held, width = measured.differences, measured.reward_width
                tiny = held[: settings.tiny]
                bounds = {
                    "hedged": measured.bound,
                    "betting": lower_bound(held, width, alpha, "betting"),
                    "bernstein": lower_bound(held, width, alpha, "bernstein"),
                    "training": lower_bound(training, width, alpha, measured.method),
                    "normal": float(tiny.mean() - z * tiny.std(ddof=1) / np.sqrt(tiny.size)),
                }
                yield MeasuredUpdate(
                    gain,
                    bounds,
                    measured.mean,
                    float(training.mean()),
                    float(held.std(ddof=1)),
                    width,
                    measured.n,
                )


def tolerance(alpha: float, n: int, z: float = 3.0) -> float:
    """z binomial standard errors of a violation share at rate alpha over n updates. Each
    update's violation has probability <= alpha given the run so far, so the count is
    dominated by a Binomial(n, alpha); 3 SE above alpha is exceeded with probability ~0.2%
    (normal approximation to that binomial)."""
    return z * float(np.sqrt(alpha * (1 - alpha) / n))


def summary(updates: list[MeasuredUpdate]) -> dict[str, float]:
    """The share of updates whose bound exceeds the gain, per bound, the mean pair mean minus
    gain (held-out, training) with its standard error, and the pairs an update of the mean
    gain would need to be certified (``teamtr.measured.pairs_to_certify``)."""
    gain = np.array([u.gain for u in updates])
    n = gain.size
    held = np.array([u.held_out_mean for u in updates]) - gain
    # An update of the mean size, with the pairs' typical spread, on the mean return range.
    sd = float(np.sqrt(np.mean([u.held_out_sd**2 for u in updates])))
    width = float(np.mean([u.reward_width for u in updates]))
    trained = np.array([u.training_mean for u in updates]) - gain
    shares = {
        name: float(np.mean(np.array([u.bounds[name] for u in updates]) > gain))
        for name in BOUND_NAMES
    }
    return {
        "updates": float(n),
        **shares,
        "mean_bound": float(np.mean([u.bounds["hedged"] for u in updates])),
        "certified": float(np.mean([u.bounds["hedged"] > 0 for u in updates])),
        "certified_betting": float(np.mean([u.bounds["betting"] > 0 for u in updates])),
        "held_out_bias": float(held.mean()),
        "held_out_bias_se": float(held.std(ddof=1) / np.sqrt(n)),
        "training_bias": float(trained.mean()),
        "training_bias_se": float(trained.std(ddof=1) / np.sqrt(n)),
        "mean_gain": float(gain.mean()),
        "mean_pairs": float(np.mean([u.n for u in updates])),
        "pairs_to_certify": float(pairs_to_certify(float(gain.mean()), sd, width) or np.nan),
        "pair_sd": sd,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m proofs_check.measured_certificate", description=__doc__
    )
    parser.add_argument("--seeds", type=int, default=Settings.seeds)
    parser.add_argument("--held-out", type=int, default=Settings.held_out)
    parser.add_argument("--radius", type=float, default=Settings.radius)
    parser.add_argument(
        "--batch", type=int, default=0, help="sequential draws: pairs a batch (0: fixed n)"
    )
    parser.add_argument("--cap", type=int, default=Settings.cap, help="sequential draws' cap")
    parser.add_argument(
        "--coupled", action="store_true", help="continue held-out episodes with common numbers"
    )
    args = parser.parse_args(argv)
    recorded = "anytime (recorded)" if args.batch else "hedged"
    print(
        f"| family | n | updates | {recorded} | betting | bernstein | training twin | normal n=2 "
        f"| held-out mean - gain | training mean - gain | mean gain | mean {recorded} bound "
        f"| certified > 0: {recorded} (betting) | pairs to certify the mean gain (Bernstein) "
        "| mean pairs drawn | pair sd |"
    )
    print("|" + " --- |" * 16)
    for family in FAMILIES:
        for n_agents in (2, 3, 4):
            settings = Settings(
                family,
                n_agents,
                args.seeds,
                args.held_out,
                radius=args.radius,
                batch=args.batch,
                cap=args.cap,
                coupled=args.coupled,
            )
            row = summary(list(measured_updates(settings)))
            shares = " | ".join(f"{row[name]:.3f}" for name in BOUND_NAMES)
            print(
                f"| {family} | {n_agents} | {row['updates']:.0f} | {shares} "
                f"| {row['held_out_bias']:+.4f} ± {row['held_out_bias_se']:.4f} "
                f"| {row['training_bias']:+.4f} ± {row['training_bias_se']:.4f} "
                f"| {row['mean_gain']:+.4f} | {row['mean_bound']:+.4f} "
                f"| {row['certified']:.2f} ({row['certified_betting']:.2f}) "
                f"| {row['pairs_to_certify']:.0f} | {row['mean_pairs']:.0f} "
                f"| {row['pair_sd']:.3f} |"
            )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
