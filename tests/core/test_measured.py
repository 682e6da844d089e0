"""The measured certificate's bounds (teamtr.measured) and how the stage loop records them."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from statistics import NormalDist

import numpy as np
import pytest

from teamtr import StageConfig, run_stage, run_stages
from teamtr.config import SettingError
from teamtr.measured import (
    MeasuredCertificate,
    PairedDifferences,
    bernstein_lower_bound,
    betting_lower_bound,
    lower_bound,
    measure,
    pairs_to_certify,
    stage_measured,
)
from tests.core.toy_backend import ToyGame, ToyRollouts, ToySampler, ToyUpdater, toy_game

ALPHA = 0.05


def test_bernstein_bound_is_maurer_pontil_theorem_4() -> None:
    rng = np.random.default_rng(0)
    for n in (2, 7, 50):
        d = rng.uniform(-3.0, 3.0, size=n)
        # V_n of Maurer & Pontil: the mean of (X_i - X_j)^2 / 2 over ordered pairs i != j.
        pairwise = (d[:, None] - d[None, :]) ** 2 / 2.0
        variance = pairwise.sum() / (n * (n - 1))
        log_term = math.log(2.0 / ALPHA)
        expected = (
            d.mean()
            - math.sqrt(2.0 * variance * log_term / n)
            - 7.0 * 6.0 * log_term / (3.0 * (n - 1))
        )
        assert bernstein_lower_bound(d, 3.0, ALPHA) == pytest.approx(max(expected, -3.0), abs=1e-9)


def test_bounds_scale_with_the_reward_range() -> None:
    d = np.random.default_rng(1).uniform(-1.0, 1.0, size=40)
    for method in ("bernstein", "betting"):
        assert lower_bound(7.5 * d, 7.5, ALPHA, method) == pytest.approx(
            7.5 * lower_bound(d, 1.0, ALPHA, method), abs=1e-9
        )


def betting_by_loop(d: np.ndarray, width: float, alpha: float) -> float:
    """Waudby-Smith & Ramdas (2023) Thm 2, one side, step by step on X = (D + w) / (2w)."""
    x = (d + width) / (2 * width)
    n = x.size
    mean, variance = 0.5, 0.25  # mu_0, sigma2_0
    total, squares = 0.0, 0.0
    numerator, bets, penalty = 0.0, 0.0, 0.0
    for t, value in enumerate(x, start=1):
        bet = min(math.sqrt(2 * math.log(1 / alpha) / (n * variance)), 0.5)
        v = 4 * (value - mean) ** 2
        penalty += v * (-math.log(1 - bet) - bet) / 4
        numerator += bet * value
        bets += bet
        total += value
        mean = (0.5 + total) / (t + 1)
        squares += (value - mean) ** 2
        variance = (0.25 + squares) / (t + 1)
    lower = (numerator - math.log(1 / alpha) - penalty) / bets
    return max(2 * width * lower - width, -width)


def test_betting_bound_matches_the_step_by_step_definition() -> None:
    rng = np.random.default_rng(2)
    for n in (1, 5, 64):
        d = rng.uniform(-2.0, 2.0, size=n)
        assert betting_lower_bound(d, 2.0, ALPHA) == pytest.approx(
            betting_by_loop(d, 2.0, ALPHA), abs=1e-9
        )


# Differences in [-1, 1] with exact means: a symmetric one, a skewed one (frequent small gains,
# rare large losses: the update a certificate must not pass), and one that is mostly exactly 0
# (an agent that rarely acts).
DISTRIBUTIONS = {
    "symmetric": (np.array([-1.0, 0.0, 1.0]), np.array([0.3, 0.4, 0.3])),
    "skewed": (np.array([0.1, -1.0]), np.array([0.9, 0.1])),
    "mostly_zero": (np.array([-1.0, 0.0, 0.5]), np.array([0.04, 0.9, 0.06])),
}


def violation_share(bound, values, probabilities, n: int, repeats: int, seed: int) -> float:
    rng = np.random.default_rng(seed)
    mean = float(values @ probabilities)
    draws = rng.choice(values, size=(repeats, n), p=probabilities)
    return float(np.mean([bound(row) > mean for row in draws]))


def binomial_tolerance(alpha: float, repeats: int) -> float:
    """3 standard errors of a share at rate alpha: exceeded by chance with probability ~0.2%."""
    return 3.0 * math.sqrt(alpha * (1 - alpha) / repeats)


@pytest.mark.parametrize("method", ["bernstein", "betting"])
@pytest.mark.parametrize("name", sorted(DISTRIBUTIONS))
@pytest.mark.parametrize("n", [2, 10, 200])
def test_bounds_cover_the_true_mean_at_their_level(method, name, n) -> None:
    values, probabilities = DISTRIBUTIONS[name]
    repeats = 1500
    share = violation_share(
        lambda row: lower_bound(row, 1.0, ALPHA, method), values, probabilities, n, repeats, n
    )
    assert share <= ALPHA + binomial_tolerance(ALPHA, repeats)


def test_the_coverage_check_rejects_the_normal_approximation_at_tiny_n() -> None:
    """The same check fails a bound that is not valid at finite n: it has power."""
    values, probabilities = DISTRIBUTIONS["skewed"]
    z = NormalDist().inv_cdf(1 - ALPHA)
    repeats = 1500

    def normal(row: np.ndarray) -> float:
        return float(row.mean() - z * row.std(ddof=1) / math.sqrt(row.size))

    share = violation_share(normal, values, probabilities, 3, repeats, 0)
    assert share > ALPHA + binomial_tolerance(ALPHA, repeats)


def test_pairs_outside_the_declared_range_are_refused() -> None:
    with pytest.raises(ValueError, match="outside"):
        PairedDifferences(np.array([0.5, -2.5]), reward_width=2.0)
    with pytest.raises(ValueError, match="reward_width"):
        PairedDifferences(np.array([0.5]), reward_width=0.0)
    with pytest.raises(ValueError, match="finite"):
        PairedDifferences(np.array([np.nan]), reward_width=1.0)


def _certificate(d: np.ndarray) -> MeasuredCertificate:
    return measure(PairedDifferences(d, 1.0), 0.9, "betting")


def test_stage_bound_splits_alpha_over_the_order_and_sums_the_kept_updates() -> None:
    rng = np.random.default_rng(3)
    first, second, third = (_certificate(rng.uniform(-1, 1, size=30)) for _ in range(3))
    stage = stage_measured([first, second, third], [True, False, True], 0.9, "betting")
    assert stage is not None
    expected = sum(
        betting_lower_bound(c.differences, 1.0, 0.1 / 3)
        for c in (first, third)
        if c.differences is not None
    )
    assert stage.bound == pytest.approx(expected, abs=1e-12)
    assert stage.n == 60 and stage.mean == pytest.approx(first.mean + third.mean, abs=1e-12)
    # A kept update that was not measured leaves the stage unmeasured; one not kept gains 0.
    assert stage_measured([first, None], [True, True], 0.9, "betting") is None
    assert stage_measured([first, None], [True, False], 0.9, "betting") is not None


def test_an_update_records_the_spread_of_its_pairs_and_a_stage_none() -> None:
    differences = np.array([0.5, -0.25, 0.0, 1.0])
    certificate = measure(PairedDifferences(differences, 1.0), 0.95, "betting")
    assert certificate.sd == pytest.approx(float(np.std(differences, ddof=1)), abs=1e-12)
    assert certificate.as_dict()["sd"] == certificate.sd
    assert measure(PairedDifferences(np.array([0.5]), 1.0)).sd is None
    stage = stage_measured([certificate], [True], 0.95, "betting")
    assert stage is not None and stage.sd is None and "sd" not in stage.as_dict()


def test_the_console_line_names_bound_level_and_pairs() -> None:
    certificate = MeasuredCertificate(64, 0.2, 0.1234, 0.95, "betting", 1.0)
    assert certificate.line() == "improvement >= +0.123 with 95% confidence (n = 64 pairs)"


@pytest.mark.parametrize(
    ("key", "value"),
    [
        ("certificate_groups", -1),
        ("certificate_groups", 2.5),
        ("certificate_groups", True),
        ("certificate_level", 1.0),
        ("certificate_level", 0.0),
        ("certificate_bound", "hoeffding"),
        ("accept", "always"),
    ],
)
def test_certificate_settings_are_checked(key, value) -> None:
    with pytest.raises(SettingError) as error:
        StageConfig(**{key: value})
    assert error.value.key == key


def test_the_measured_accept_rule_needs_held_out_groups_and_the_teamtr_scheme() -> None:
    with pytest.raises(SettingError) as error:
        StageConfig(accept="measured")
    assert error.value.key == "accept"
    with pytest.raises(SettingError):
        StageConfig(accept="measured", certificate_groups=8, scheme="stale")
    StageConfig(accept="measured", certificate_groups=8)


@dataclass(frozen=True)
class PairedToyRollouts(ToyRollouts):
    held_out: tuple[np.ndarray, np.ndarray] | None = None
    """(agent state, action) of each held-out one-step episode."""
    pairs: PairedDifferences | None = None


@dataclass
class PairingToySampler(ToySampler):
    """The toy game's sampler with held-out one-step episodes: agent k's state is drawn with
    probability 1/n, then its action. After agent j's update an episode in another agent's
    state is kept whole (difference 0), one in j's state is played again by the new policy,
    so a difference has expectation (1/n) (pi'_j - pi_j) . r_j = J(new) - J(old)."""

    held_out_groups: int = 0
    seed: int = 0
    calls: list = field(default_factory=list)

    def __post_init__(self) -> None:
        self.rng = np.random.default_rng(self.seed)

    def with_held_out(self, groups: int) -> PairingToySampler:
        other = PairingToySampler(self.game, groups, calls=self.calls)
        other.rng = self.rng
        return other

    def continue_held_out(self, team, previous, updated_agent) -> PairedDifferences | None:
        return self._pairs(team, previous.held_out, updated_agent)

    def _pairs(self, team, held_out, updated_agent) -> PairedDifferences:
        old_states, old_actions = held_out
        new_actions = old_actions.copy()
        redraw = old_states == updated_agent
        new_actions[redraw] = self._actions(team, old_states[redraw])
        rewards = self.game.rewards
        width = float(rewards.max() - rewards.min())
        difference = rewards[old_states, new_actions] - rewards[old_states, old_actions]
        return PairedDifferences(difference, width, updated_agent)

    def _actions(self, team, states: np.ndarray) -> np.ndarray:
        return np.array([self.rng.choice(team.agent(k).size, p=team.agent(k)) for k in states])

    def sample(self, team, *, previous=None, updated_agent=None) -> PairedToyRollouts:
        base = super().sample(team)
        n = team.n_agents
        states = self.rng.integers(0, n, size=self.held_out_groups)
        held_out = (states, self._actions(team, states))
        pairs = None
        if previous is not None and previous.held_out is not None and updated_agent is not None:
            pairs = self._pairs(team, previous.held_out, updated_agent)
        rollouts = PairedToyRollouts(
            base.behaviour, base.occupancy, base.advantage, held_out=held_out, pairs=pairs
        )
        self.calls.append(rollouts)
        return rollouts


def test_a_sampler_that_does_not_pair_leaves_updates_not_measured() -> None:
    game = toy_game()
    config = StageConfig(certificate_groups=16)
    report, _ = run_stage(
        game.uniform_team(), ToySampler(game), ToyUpdater(), config, game.penalty()
    )
    assert all(r.measured is None for r in report.records) and report.measured is None
    with pytest.raises(ValueError, match="pairs held-out groups"):
        run_stage(
            game.uniform_team(),
            ToySampler(game),
            ToyUpdater(),
            StageConfig(certificate_groups=16, accept="measured"),
            game.penalty(),
        )


def test_every_kept_update_is_measured_from_the_draw_that_continues_its_held_out_groups() -> None:
    game: ToyGame = toy_game(n_agents=3, seed=4)
    sampler = PairingToySampler(game, seed=4)
    config = StageConfig(radius=0.05, certificate_groups=40, certificate_level=0.9)
    stages = list(run_stages(game.uniform_team(), sampler, ToyUpdater(), config, game.penalty(), 2))
    for report, _ in stages:
        for record in report.records:
            assert record.kept and record.measured is not None
            assert record.measured.n == 40 and record.measured.level == 0.9
            if record.resample is not None:
                assert record.resample.behaviour is not record.base
                assert record.resample.pairs.updated_agent == record.agent
                np.testing.assert_array_equal(
                    record.measured.differences, record.resample.pairs.differences
                )
        expected = stage_measured([r.measured for r in report.records], [True] * 3, 0.9, "betting")
        assert report.measured == expected
    # Every update but the last is measured from the draw the next update trains on; the last
    # from its held-out groups' continuation alone: no sampler call beyond the updates' own.
    for report, _ in stages:
        *inner, last = report.records
        assert all(r.resample is not None for r in inner) and last.resample is None
    counted = [id(r) for report, _ in stages for r in report.sampled_rollouts]
    assert counted == [id(r) for r in sampler.calls]


def sample_with(mean: float, sd: float, n: int) -> np.ndarray:
    """n values with exactly this sample mean and standard deviation (ddof=1)."""
    offset = sd * math.sqrt((n - 1) / (2 * (n // 2)))
    values = np.array([mean + offset, mean - offset] * (n // 2) + [mean] * (n % 2))
    return values


def test_pairs_to_certify_is_the_first_n_whose_bernstein_bound_is_positive() -> None:
    for mean, sd in ((0.12, 0.4), (0.3, 0.1), (0.05, 0.3)):
        n = pairs_to_certify(mean, sd, 1.0, 0.95)
        assert n is not None
        for size, positive in ((n, True), (n - 1, False)):
            sample = sample_with(mean, sd, size)
            assert sample.std(ddof=1) == pytest.approx(sd, rel=1e-12)
            assert (bernstein_lower_bound(sample, 1.0, 0.05) > 0) == positive
    assert pairs_to_certify(-0.1, 0.2, 1.0) is None
