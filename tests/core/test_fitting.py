"""The log-log exponent fit against exact power laws."""

import math

import numpy as np
import pytest

from teamtr.fitting import finite_or_none, fit_exponent, loglog_slope


@pytest.mark.parametrize("alpha", [0.5, 1.0, 1.94, 2.0])
def test_loglog_slope_recovers_an_exact_power_law(alpha):
    n = np.arange(2, 9)
    slope, intercept = loglog_slope(n, 3.0 * n**alpha)
    assert slope == pytest.approx(alpha, abs=1e-12)
    assert intercept == pytest.approx(math.log(3.0), abs=1e-12)


def test_noiseless_samples_give_zero_bootstrap_spread():
    n = [2, 3, 4, 5]
    fit = fit_exponent(n, [np.full(4, 0.1 * k**1.5) for k in n], n_bootstrap=50)
    assert fit.alpha == pytest.approx(1.5, abs=1e-12)
    assert fit.bootstrap_std == pytest.approx(0.0, abs=1e-12)
    assert fit.ci95[0] == pytest.approx(1.5, abs=1e-12)
    assert fit.ci95[1] == pytest.approx(1.5, abs=1e-12)


def test_bootstrap_interval_contains_the_fit_of_noisy_samples():
    rng = np.random.default_rng(0)
    n = [2, 4, 8]
    samples = [k**2 * rng.lognormal(0.0, 0.2, size=30) for k in n]
    fit = fit_exponent(n, samples, n_bootstrap=300)
    assert fit.ci95[0] <= fit.alpha <= fit.ci95[1]
    assert abs(fit.alpha - 2.0) < 0.2
    assert fit.bootstrap_std > 0


def test_non_positive_means_have_no_exponent_and_serialise_as_null():
    fit = fit_exponent([2, 3], [[0.0, 0.0], [1.0, 2.0]], n_bootstrap=10)
    assert math.isnan(fit.alpha)
    assert fit.as_json()["alpha"] is None
    assert finite_or_none(float("inf")) is None
    assert finite_or_none(2.5) == 2.5
