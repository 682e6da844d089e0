"""The measured certificate's bounds (teamtr.measured) and how the stage loop records them."""

from __future__ import annotations

import inspect
import itertools
import math
from dataclasses import dataclass, field
from statistics import NormalDist

import numpy as np
import pytest

from teamtr import StageConfig, run_stage, run_stages
from teamtr.config import SettingError
from teamtr.measured import (
    ANYTIME,
    BOUNDS,
    DEFAULT_BOUND,
    FUTILITY_RULES,
    HEDGE_TRUNCATION,
    STOPS,
    MeasuredCertificate,
    PairedDifferences,
    anytime_lower_bound,
    anytime_upper_bound,
    bernstein_lower_bound,
    betting_lower_bound,
    hedged_lower_bound,
    lower_bound,
    measure,
    pairs_to_certify,
    sequential_measure,
    sequential_stop,
    stage_measured,
)
from teamtr.measured.certificate import TREND_FROM
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


METHODS = (*BOUNDS, ANYTIME)
"""Every bound ``lower_bound`` computes: the three of ``[stage] certificate_bound`` and the
confidence sequence's."""


def test_bounds_scale_with_the_reward_range() -> None:
    d = np.random.default_rng(1).uniform(-1.0, 1.0, size=40)
    for method in METHODS:
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


def hedged_capital_by_loop(x: np.ndarray, m: float, alpha: float, anytime: bool) -> float:
    """K+(m) of Waudby-Smith & Ramdas (2024)'s hedged capital process, one side, step by step
    on X in [0, 1]: bets from the plug-in mean and variance of the steps before, truncated at
    c/m; the fixed-n bets use n, the confidence sequence's t log(1 + t)."""
    n = x.size
    mean, variance = 0.5, 0.25  # mu_0, sigma2_0
    total, squares, capital = 0.0, 0.0, 1.0
    for t, value in enumerate(x, start=1):
        scale = t * math.log(1 + t) if anytime else n
        bet = math.sqrt(2 * math.log(1 / alpha) / (scale * variance))
        if m > 0:
            bet = min(bet, HEDGE_TRUNCATION / m)
        capital *= 1 + bet * (value - m)
        total += value
        mean = (0.5 + total) / (t + 1)
        squares += (value - mean) ** 2
        variance = (0.25 + squares) / (t + 1)
    return capital


@pytest.mark.parametrize("anytime", [False, True], ids=["fixed_n", "anytime"])
def test_hedged_bound_is_where_the_capital_falls_below_one_over_alpha(anytime) -> None:
    """L = inf {m : K+(m) < 1/alpha}: K+ at L is >= 1/alpha and just above L it is not, with
    K+ recomputed step by step; and K+ never rises with m (why {K+ < 1/alpha} is an interval)."""
    rng = np.random.default_rng(5)
    bound = anytime_lower_bound if anytime else hedged_lower_bound
    for n in (3, 20, 90):
        d = np.clip(rng.normal(0.3, 0.5, size=n), -1.0, 1.0)
        x = (d + 1.0) / 2.0
        lower = (bound(d, 1.0, ALPHA) + 1.0) / 2.0
        if lower > 0:
            assert hedged_capital_by_loop(x, lower, ALPHA, anytime) >= 1 / ALPHA * (1 - 1e-9)
        assert hedged_capital_by_loop(x, lower + 1e-8, ALPHA, anytime) < 1 / ALPHA
        grid = np.linspace(0.0, 1.0, 201)
        capital = [hedged_capital_by_loop(x, m, ALPHA, anytime) for m in grid]
        assert np.all(np.diff(capital) <= 1e-9 * np.maximum(capital[:-1], 1.0))


def test_the_upper_bound_is_the_lower_bound_of_the_negated_pairs() -> None:
    d = np.random.default_rng(6).uniform(-0.5, 1.0, size=50)
    upper = anytime_upper_bound(d, 1.0, ALPHA)
    assert upper == -anytime_lower_bound(-d, 1.0, ALPHA)
    assert anytime_lower_bound(d, 1.0, ALPHA) < d.mean() < upper


def test_hedged_is_the_default_of_the_bounds_and_of_the_config() -> None:
    assert DEFAULT_BOUND == "hedged" == StageConfig().certificate_bound
    for function in (measure, lower_bound, stage_measured):
        assert inspect.signature(function).parameters["method"].default == DEFAULT_BOUND


@pytest.mark.parametrize("method", METHODS)
@pytest.mark.parametrize("level", [0.8, 0.9, 0.95])
def test_a_certificate_is_its_bound_at_its_stated_level(method, level) -> None:
    """What ties a recorded bound to its label: ``measure(...).bound`` is
    ``lower_bound(pairs, w, 1 - level)`` exactly (a bound at another alpha labelled ``level``
    fails here whatever the coverage tests can see)."""
    d = np.random.default_rng(7).uniform(-1.5, 2.0, size=60)
    certificate = measure(PairedDifferences(d, 2.0), level, method)
    assert certificate.level == level and certificate.method == method
    assert certificate.bound == lower_bound(d, 2.0, 1.0 - level, method)
    for other in (0.5, 0.99):  # and the level moves it: nothing else could be recorded
        assert certificate.bound != lower_bound(d, 2.0, 1.0 - other, method)


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


@pytest.mark.parametrize("method", METHODS)
@pytest.mark.parametrize("name", sorted(DISTRIBUTIONS))
@pytest.mark.parametrize("n", [2, 10, 200])
def test_bounds_cover_the_true_mean_at_their_level(method, name, n) -> None:
    values, probabilities = DISTRIBUTIONS[name]
    repeats = 1500
    share = violation_share(
        lambda row: lower_bound(row, 1.0, ALPHA, method), values, probabilities, n, repeats, n
    )
    assert share <= ALPHA + binomial_tolerance(ALPHA, repeats)


def exact_violation(method: str, level: float, n: int, p: float) -> float:
    """P(measure's bound > E[D]) exactly, for n pairs D = +1 with probability p, else -1 (the
    bound on [0, 1] is then a Bernoulli mean's): every one of the 2^n orders enumerated."""
    mean = 2 * p - 1
    total = 0.0
    for signs in itertools.product((-1.0, 1.0), repeat=n):
        d = np.array(signs)
        if measure(PairedDifferences(d, 1.0), level, method).bound > mean:
            ups = int((d > 0).sum())
            total += p**ups * (1 - p) ** (n - ups)
    return total


@pytest.mark.parametrize("method", METHODS)
def test_exact_coverage_on_a_coin_at_its_stated_level(method) -> None:
    """P(bound > mean) <= alpha computed exactly (no sampling), at means across the range."""
    for p in (0.3, 0.435, 0.6, 0.85):
        assert exact_violation(method, 0.95, 8, p) <= ALPHA


def test_exact_coverage_separates_95_from_80_percent() -> None:
    """On 8 coin-flip pairs with P(+1) = 0.435 the hedged bound at 95% exceeds the mean with
    probability 0.0013 and the same bound at 80% with probability 0.075 > 0.05, computed
    exactly: a bound at 80% labelled 95% fails the check above."""
    assert exact_violation("hedged", 0.95, 8, 0.435) == pytest.approx(0.0013, abs=5e-5)
    assert exact_violation("hedged", 0.80, 8, 0.435) == pytest.approx(0.0752, abs=5e-5)


TIGHT_COIN = 0.28
"""P(D = +1) of a coin-flip pair D in {-1, +1} where the hedged bound is nearly tight at n = 2:
E[D] = -0.44. The hedged (and anytime) bound of (+1, +1) is -0.781 (-0.748) at 95% and
-0.424 at 80%, every other pair's is below -0.96, so at 95% no draw exceeds the mean and at
80% exactly the draws (+1, +1) do: probability 0.28^2 = 0.0784."""


@pytest.mark.parametrize("method", ["hedged", ANYTIME])
def test_coverage_at_the_stated_level_where_the_bound_is_nearly_tight(method) -> None:
    """Sampled coverage with the 3-standard-error tolerance of the checks above, 4000 draws of
    2 pairs: the share allowed is 0.05 + 3 sqrt(0.05 * 0.95 / 4000) = 0.0603 (241 draws).
    The bound at 95% exceeds the mean with probability 0 here (TIGHT_COIN), so it passes
    always; a bound at 80% labelled 95% exceeds it with probability 0.0784, and passes only if
    Binomial(4000, 0.0784) <= 241: probability 5.5e-6."""
    repeats = 4000
    rng = np.random.default_rng(11)
    draws = np.where(rng.random((repeats, 2)) < TIGHT_COIN, 1.0, -1.0)
    mean = 2 * TIGHT_COIN - 1
    share = float(
        np.mean([measure(PairedDifferences(row, 1.0), 0.95, method).bound > mean for row in draws])
    )
    assert share <= ALPHA + binomial_tolerance(ALPHA, repeats)


def test_pairs_the_update_was_chosen_on_are_optimistic_and_held_out_ones_are_not() -> None:
    """Why the pairs are held out. 40 candidate updates, each of true gain 0 (8 coin-flip pairs
    D = +-1, P(+1) = 1/2); the update keeps the candidate whose pairs look best (the largest
    bound, which here is the largest mean: only 8 pairs of +1 clear 0) and the training twin
    bounds it on those same pairs. A candidate's hedged bound at 95% exceeds 0 with probability
    q = 1/256 (exactly: only the all-(+1) order), so the chosen one's does with probability
    1 - (1 - q)^40 = 0.145 > 0.05: the twin fails coverage. Fresh pairs of the chosen candidate
    are independent of the choice: q <= 0.05, as for any one update."""
    n, candidates = 8, 40
    orders = [np.array(signs) for signs in itertools.product((-1.0, 1.0), repeat=n)]
    bounds = np.array([measure(PairedDifferences(d, 1.0), 0.95).bound for d in orders])
    q = float(np.mean(bounds > 0.0))  # every order has probability 2^-8
    assert q == 1 / 256
    training_twin = 1 - (1 - q) ** candidates
    assert training_twin == pytest.approx(0.1449, abs=5e-5) and training_twin > ALPHA
    assert q <= ALPHA


def test_the_anytime_bound_holds_at_every_n_at_once_exactly() -> None:
    """P(exists t <= 10: L_t > E[D]) <= alpha on coin-flip pairs, every path of 10 enumerated
    (Ville's inequality: the bound may be read after every pair)."""
    n = 10
    for p in (0.3, 0.5):
        mean = 2 * p - 1
        violates = {
            signs: anytime_lower_bound(np.array(signs), 1.0, ALPHA) > mean
            for t in range(1, n + 1)
            for signs in itertools.product((-1.0, 1.0), repeat=t)
        }
        probability = 0.0
        for path in itertools.product((-1.0, 1.0), repeat=n):
            if any(violates[path[:t]] for t in range(1, n + 1)):
                ups = sum(step > 0 for step in path)
                probability += p**ups * (1 - p) ** (n - ups)
        assert probability <= ALPHA


THREE_POINT = np.array([-1.0, 0.0, 1.0])


def drawer(probabilities, seed: int):
    """Fresh pairs D in {-1, 0, 1} with these probabilities, ``count`` at a time."""
    rng = np.random.default_rng(seed)

    def draw(count: int) -> PairedDifferences:
        return PairedDifferences(rng.choice(THREE_POINT, size=count, p=probabilities), 1.0)

    return draw


def sequential(probabilities, seed: int, batch: int = 16, cap: int = 256) -> MeasuredCertificate:
    draw = drawer(probabilities, seed)
    return sequential_measure(draw(batch), draw, 0.95, batch, cap)


def test_sequential_draws_stop_at_the_first_batch_whose_anytime_bound_clears_zero() -> None:
    for seed in range(20):
        certificate = sequential([0.02, 0.78, 0.20], seed)  # E[D] = +0.18
        d = certificate.differences
        assert d is not None and certificate.stop == "certified" and certificate.bound > 0
        assert certificate.method == ANYTIME and certificate.n % 16 == 0 and certificate.n < 256
        assert certificate.bound == anytime_lower_bound(d, 1.0, ALPHA)
        for looked in range(16, certificate.n, 16):  # no earlier look stopped
            assert sequential_stop(d[:looked], 1.0, ALPHA, 256) is None


def test_sequential_draws_give_up_early_on_an_update_that_loses() -> None:
    stops = [sequential([0.15, 0.80, 0.05], seed) for seed in range(20)]  # E[D] = -0.10
    assert all(c.stop == "futile" and c.n < 256 and c.bound < 0 for c in stops)
    assert {c.stop for c in stops} <= set(STOPS)


def projected_bound(pairs: np.ndarray, mean: float, cap: int) -> float:
    """The anytime bound of ``pairs`` continued to ``cap`` pairs by repeating them in order,
    each shifted by (mean - their mean) and kept inside [-1, 1]."""
    repeated = np.concatenate([pairs] * (cap // pairs.size + 1))[:cap]
    return anytime_lower_bound(np.clip(repeated + mean - pairs.mean(), -1.0, 1.0), 1.0, ALPHA)


def test_the_trend_rule_gives_up_where_the_trend_would_not_be_certified_within_the_cap() -> None:
    """'trend': from TREND_FROM pairs on, draws stop once the pairs continued at their mean plus
    one standard error would not be certified at the cap; not before."""
    cap = 128
    given_up_on_trend = 0
    for seed in range(12):
        draw = drawer([0.04, 0.92, 0.04], seed)  # E[D] = 0: nothing to certify
        certificate = sequential_measure(draw(16), draw, 0.95, 16, cap, "trend")
        d = certificate.differences
        assert d is not None

        def trend_fails(n: int, d: np.ndarray = d) -> bool:
            mean_plus_se = d[:n].mean() + d[:n].std(ddof=1) / math.sqrt(n)
            return projected_bound(d[:n], mean_plus_se, cap) <= 0

        for looked in range(16, certificate.n, 16):
            assert looked < TREND_FROM or not trend_fails(looked)
            assert sequential_stop(d[:looked], 1.0, ALPHA, cap, "trend") is None
        if certificate.stop == "futile" and trend_fails(certificate.n):
            assert sequential_stop(d, 1.0, ALPHA, cap, "upper_bound") is None  # the trend's
            assert TREND_FROM <= certificate.n < cap
            given_up_on_trend += 1
    assert given_up_on_trend >= 10


def test_the_trend_rule_draws_fewer_pairs_on_updates_that_gain_nothing() -> None:
    """On the same draws, 'upper_bound' waits for its anytime upper bound's mean to fail (it
    never stops these at 32 pairs), 'trend' judges their current trend: on a zero-mean update,
    its mean pairs are at most 60% of the other's (57% fewer in 300 simulations:
    docs/measured_certificate.md)."""
    used = {}
    for rule in FUTILITY_RULES:
        used[rule] = []
        for seed in range(12):
            draw = drawer([0.04, 0.92, 0.04], seed)
            used[rule].append(sequential_measure(draw(16), draw, 0.95, 16, 256, rule).n)
    assert min(used["upper_bound"]) > TREND_FROM
    assert np.mean(used["trend"]) <= 0.6 * np.mean(used["upper_bound"])
    with pytest.raises(ValueError, match="futility"):
        sequential_stop(np.zeros(32), 1.0, ALPHA, 256, "never")


def test_sequential_draws_stop_at_the_cap() -> None:
    runs = [sequential([0.10, 0.80, 0.10], seed, cap=40) for seed in range(10)]
    assert all(c.n <= 40 and c.stop in STOPS for c in runs)
    # 16 + 16, then the last batch only up to the cap: 8.
    assert any(c.stop == "cap" and c.n == 40 for c in runs)


def test_sequential_certificates_cover_the_mean_at_their_level() -> None:
    """E[D] = 0: a certificate (bound > 0) is a violation. 300 runs, the 3-standard-error
    tolerance of the checks above (share <= 0.088)."""
    repeats = 300
    wrong = [sequential([0.10, 0.80, 0.10], seed, cap=128).bound > 0 for seed in range(repeats)]
    assert float(np.mean(wrong)) <= ALPHA + binomial_tolerance(ALPHA, repeats)


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
        ("certificate_batch", -1),
        ("certificate_batch", 1.5),
        ("certificate_cap", -2),
        ("certificate_futility", "never"),
        ("accept", "always"),
    ],
)
def test_certificate_settings_are_checked(key, value) -> None:
    with pytest.raises(SettingError) as error:
        StageConfig(**{key: value})
    assert error.value.key == key


def test_sequential_draws_need_a_cap_of_at_least_the_held_out_groups() -> None:
    with pytest.raises(SettingError) as error:
        StageConfig(certificate_groups=64, certificate_batch=32, certificate_cap=32)
    assert error.value.key == "certificate_cap"
    StageConfig(certificate_groups=64, certificate_batch=32, certificate_cap=64)
    StageConfig(certificate_groups=64, certificate_cap=0)  # read only with a batch
    with pytest.raises(SettingError) as error:
        StageConfig(certificate_batch=32)  # nothing held out to draw on from
    assert error.value.key == "certificate_batch"


def test_sequential_draws_need_a_sampler_that_draws_pairs() -> None:
    game = toy_game()
    config = StageConfig(certificate_groups=16, certificate_batch=8)
    with pytest.raises(ValueError, match="draw_pairs"):
        run_stage(
            game.uniform_team(), PairingToySampler(game), ToyUpdater(), config, game.penalty()
        )


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

    def with_held_out(self, groups: int, chained: bool = True) -> PairingToySampler:
        # Fresh held-out groups every draw, chained or not.
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
        expected = stage_measured(
            [r.measured for r in report.records], [True] * 3, 0.9, config.certificate_bound
        )
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
