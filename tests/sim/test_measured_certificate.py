"""The measured certificate on the tabular world, where every improvement is exact.

Statistical tolerances: a sampled mean is checked against its exact value within 4 standard
errors; a violation share (updates whose bound exceeds their exact gain) against alpha within
3 binomial standard errors, sqrt(alpha (1 - alpha) / N), which a valid bound exceeds by chance
with probability about 0.2% (each update's violation has probability <= alpha given the run so
far, so the count is dominated by a Binomial(N, alpha)).
"""

from __future__ import annotations

import itertools

import numpy as np
import pytest

import sim
from proofs_check.measured_certificate import (
    FAMILIES,
    Settings,
    measured_updates,
    summary,
    tolerance,
)
from sim.pairing import estimate_range, first_turns, return_estimates
from teamtr import StageConfig, run_stages
from teamtr.measured import ANYTIME, STOPS, lower_bound, sequential_stop

ALPHA = 0.05


def moved_team(mdp: sim.TurnTakingMDP, agent: int, seed: int) -> tuple[sim.TabularTeam, ...]:
    old = sim.random_team(mdp, seed, concentration=2.0)
    other = sim.random_team(mdp, seed + 100, concentration=0.5)
    return old, old.with_agent(agent, other.agent(agent))


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_paired_differences_estimate_the_exact_improvement(family: str) -> None:
    mdp = FAMILIES[family](3, 0)
    old, new = moved_team(mdp, 1, 0)
    sampler = sim.SampledSampler(mdp, n_episodes=1, seed=0)
    batch = sampler.rollout(old, 6000)
    pairs = sampler.paired_differences(batch, new, 1)
    exact = sim.evaluate(mdp, new).J - sim.evaluate(mdp, old).J
    d = pairs.differences
    assert abs(d.mean() - exact) <= 4 * d.std(ddof=1) / np.sqrt(d.size)
    # Each continuation alone is a draw of the new team: its estimates average to J(new).
    continued = return_estimates(mdp, sampler.continued(batch, new, 1))
    error = continued.std(ddof=1) / np.sqrt(continued.size)
    assert abs(continued.mean() - sim.evaluate(mdp, new).J) <= 4 * error


def test_a_continuation_keeps_every_turn_before_the_updated_agents_first() -> None:
    mdp = FAMILIES["discounted"](3, 1)
    old, new = moved_team(mdp, 2, 1)
    sampler = sim.SampledSampler(mdp, n_episodes=1, seed=1)
    batch = sampler.rollout(old, 300)
    continued = sampler.continued(batch, new, 2)
    first = first_turns(mdp, batch, 2)
    never = 0
    for e in range(batch.n_episodes):
        before, after = batch.episode == e, continued.episode == e
        if first[e] < 0:
            never += 1
            np.testing.assert_array_equal(batch.state[before], continued.state[after])
            np.testing.assert_array_equal(batch.action[before], continued.action[after])
            continue
        kept = int(first[e] - np.flatnonzero(before)[0])
        np.testing.assert_array_equal(batch.action[before][:kept], continued.action[after][:kept])
        # The continuation starts where agent 2 first acts, in the same state at the same step.
        assert continued.state[after][kept] == batch.state[first[e]]
        assert continued.time[after][kept] == batch.time[first[e]]
    assert 0 < never < batch.n_episodes
    differences = sampler.paired_differences(batch, new, 2).differences
    assert np.all(differences[first < 0] == 0.0)


def extreme_returns(mdp: sim.TurnTakingMDP) -> tuple[float, float]:
    """The least and largest return over every path the MDP allows, by enumerating them."""
    assert mdp.horizon is not None
    P = mdp.transitions_dense()
    returns = []

    def walk(state: int, t: int, total: float) -> None:
        if t == mdp.horizon:
            returns.append(total)
            return
        for action in range(mdp.n_actions):
            for following in np.flatnonzero(P[state, action] > 0):
                walk(int(following), t + 1, total + float(mdp.R[state, action]))

    for start in np.flatnonzero(mdp.rho0 > 0):
        walk(int(start), 0, 0.0)
    return min(returns), max(returns)


@pytest.mark.parametrize(
    "mdp",
    [
        sim.dialogue_mdp(2, vocab_size=2, message_length=1, n_turns=3, seed=0),
        sim.random_mdp(5, 2, 2, horizon=3, seed=4, successors=2),
    ],
)
def test_the_episodic_return_range_is_that_of_every_path(mdp: sim.TurnTakingMDP) -> None:
    assert estimate_range(mdp) == pytest.approx(extreme_returns(mdp), abs=1e-9)


def test_sampled_estimates_lie_in_their_range() -> None:
    for family, n_agents in itertools.product(sorted(FAMILIES), (2, 4)):
        mdp = FAMILIES[family](n_agents, 2)
        batch = sim.SampledSampler(mdp, 1, seed=2).rollout(sim.random_team(mdp, 2), 500)
        low, high = estimate_range(mdp)
        estimates = return_estimates(mdp, batch)
        assert np.all((estimates >= low - 1e-9) & (estimates <= high + 1e-9))


def test_the_last_step_estimate_of_a_discounted_episode_has_mean_J() -> None:
    mdp = FAMILIES["discounted"](2, 3)
    team = sim.random_team(mdp, 3)
    estimates = return_estimates(mdp, sim.SampledSampler(mdp, 1, seed=3).rollout(team, 8000))
    error = estimates.std(ddof=1) / np.sqrt(estimates.size)
    assert abs(estimates.mean() - sim.evaluate(mdp, team).J) <= 4 * error


# Enough held-out pairs that the bound sits close to the gain (the check then has teeth).
COVERAGE = {"seeds": 20, "held_out": 128, "radius": 0.3}


@pytest.fixture(scope="module")
def coverage_rows() -> dict[tuple[str, int], dict[str, float]]:
    rows = {}
    for family, n_agents in itertools.product(sorted(FAMILIES), (2, 3, 4)):
        settings = Settings(family, n_agents, **COVERAGE)  # type: ignore[arg-type]
        rows[family, n_agents] = summary(list(measured_updates(settings)))
    return rows


@pytest.mark.parametrize("bound", ["hedged", "betting", "bernstein"])
def test_measured_bounds_exceed_the_exact_gain_at_most_alpha_of_the_time(
    coverage_rows, bound
) -> None:
    for (family, n_agents), row in coverage_rows.items():
        limit = ALPHA + tolerance(ALPHA, int(row["updates"]))
        assert row[bound] <= limit, (family, n_agents, row)


def pooled(rows: dict[tuple[str, int], dict[str, float]], name: str) -> tuple[float, int]:
    counts = [(row[name] * row["updates"], row["updates"]) for row in rows.values()]
    violations = sum(c for c, _ in counts)
    total = int(sum(n for _, n in counts))
    return violations / total, total


def test_the_normal_approximation_at_two_pairs_fails_the_same_check(coverage_rows) -> None:
    share, total = pooled(coverage_rows, "normal")
    assert share > ALPHA + tolerance(ALPHA, total)


def test_the_training_twin_is_measured_not_optimistic_on_the_tabular_world(coverage_rows) -> None:
    """On the groups the update trained on, the paired mean is no larger than on held-out
    groups here (the exact updater's policy is per state, and the old side of a training pair
    is the very return the update rewarded): the twin does not fail the check, and its bias
    (pair mean minus exact gain) is within 3 standard errors of 0 or below."""
    share, total = pooled(coverage_rows, "training")
    assert share <= ALPHA + tolerance(ALPHA, total)
    for row in coverage_rows.values():
        assert row["training_bias"] <= 3 * row["training_bias_se"], row


def two_exact_stages(mdp, sampler, config: StageConfig):
    """The reports of two stages from the uniform team, each update exact, J exact."""

    def value(team):
        return sim.evaluate(mdp, team).J

    for report, _ in run_stages(
        sim.uniform_team(mdp), sampler, sim.ExactUpdater(mdp), config, mdp.penalty_model(), 2, value
    ):
        yield report


def test_the_stage_bound_holds_over_its_updates() -> None:
    violations, stages = 0, 0
    for seed in range(30):
        mdp = FAMILIES["dialogue"](3, seed)
        sampler = sim.SampledSampler(mdp, n_episodes=20, seed=seed)
        config = StageConfig(radius=0.3, certificate_groups=128, order="random", seed=seed)

        for report in two_exact_stages(mdp, sampler, config):
            assert report.measured is not None and report.realised_gain is not None
            # Each recorded bound is the configured bound at the configured level, and the
            # stage's is theirs at alpha/m summed: the labels say what was computed.
            alpha = 1 - config.certificate_level
            stage_sum = 0.0
            for record in report.records:
                measured = record.measured
                if not record.kept:  # gains exactly 0, adds nothing
                    continue
                assert measured is not None and measured.differences is not None
                assert measured.level == config.certificate_level
                assert measured.bound == lower_bound(
                    measured.differences, measured.reward_width, alpha, config.certificate_bound
                )
                stage_sum += lower_bound(
                    measured.differences,
                    measured.reward_width,
                    alpha / len(report.records),
                    config.certificate_bound,
                )
            assert report.measured.bound == pytest.approx(stage_sum, abs=1e-12)
            stages += 1
            violations += report.measured.bound > report.realised_gain
    assert violations / stages <= ALPHA + tolerance(ALPHA, stages)


def test_the_measured_accept_rule_undoes_updates_it_cannot_certify() -> None:
    kept_gains, undone, measured_count, kept_below_bound = [], 0, 0, 0
    for seed in range(20):
        mdp = FAMILIES["dialogue"](3, seed)
        sampler = sim.SampledSampler(mdp, n_episodes=20, seed=seed)
        config = StageConfig(
            radius=0.3, certificate_groups=128, order="random", seed=seed, accept="measured"
        )

        for report in two_exact_stages(mdp, sampler, config):
            records = report.records
            for position, record in enumerate(records):
                assert record.measured is not None or not record.update.accepted
                if record.measured is not None:
                    measured_count += 1
                if record.kept:
                    assert record.measured.bound >= 0
                    kept_gains.append(record.realised_gain)
                    kept_below_bound += record.realised_gain < record.measured.bound
                if record.undone:
                    undone += 1
                    assert not record.kept and record.measured.bound < 0
                    assert record.j_after == record.j_before
                    if position + 1 < len(records):
                        following = records[position + 1]
                        # The team is back at pi_hat^{i-1}, drawn afresh: the discarded
                        # resample is not what the next update trains on.
                        assert following.base is record.base
                        assert following.rollouts is not record.resample
                        assert following.rollouts.behaviour is record.base
                        assert following.rollouts.pairs is None
                        assert following.fresh_rollouts
    assert undone > 0 and len(kept_gains) > 0
    # P(kept and gain < bound) <= alpha for each measured update (not given that it was kept:
    # the rule selects), so the count over the measured updates is dominated by a
    # Binomial(measured, alpha); a kept update's bound is >= 0.
    share = kept_below_bound / measured_count
    assert share <= ALPHA + tolerance(ALPHA, measured_count)


def test_sequential_held_out_draws_cover_the_exact_gain_and_stop_by_the_rule() -> None:
    """certificate_batch > 0: each update is measured on its 32 held-out pairs, then on fresh
    ones 32 at a time (``SampledSampler.draw_pairs``) until the anytime bound decides; every
    bound is the anytime bound of the pairs drawn, and exceeds the exact gain at most alpha of
    the time (3 binomial standard errors)."""
    violations, measured_count, stops = 0, 0, []
    for seed in range(12):
        mdp = FAMILIES["dialogue"](3, seed)
        sampler = sim.SampledSampler(mdp, n_episodes=20, seed=seed)
        config = StageConfig(
            radius=0.3,
            certificate_groups=32,
            certificate_batch=32,
            certificate_cap=384,
            order="random",
            seed=seed,
        )

        for report in two_exact_stages(mdp, sampler, config):
            for record in report.records:
                measured = record.measured
                if measured is None:
                    continue
                d = measured.differences
                assert measured.method == ANYTIME and measured.stop in STOPS
                assert 32 <= measured.n <= 384 and (measured.n - 32) % 32 == 0
                assert measured.bound == lower_bound(d, measured.reward_width, ALPHA, ANYTIME)
                if measured.stop != "cap":  # it stopped at the first look that decided
                    assert sequential_stop(d, measured.reward_width, ALPHA, 384) == measured.stop
                measured_count += 1
                violations += measured.bound > record.realised_gain
                stops.append(measured.stop)
    assert violations / measured_count <= ALPHA + tolerance(ALPHA, measured_count)
    assert {"certified", "futile"} <= set(stops)
