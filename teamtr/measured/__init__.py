"""The measured certificate: each update's improvement bounded from held-out pairs.

- ``certificate``: what a sampler hands over (``PairedDifferences``), the certificate of one
  update (``measure``, or ``sequential_measure`` for pairs drawn in batches) and of a stage
  (``stage_measured``, the union bound), and ``pairs_to_certify``;
- ``confidence``: the finite-n lower bounds on a bounded mean, each derived in its docstring:
  Waudby-Smith & Ramdas' hedged capital bound (the default) and betting bound, Maurer &
  Pontil's empirical Bernstein bound, and the anytime-valid confidence sequence.
"""

from teamtr.measured.certificate import (
    DEFAULT_LEVEL,
    FUTILITY_RULES,
    STOPS,
    MeasuredCertificate,
    PairedDifferences,
    measure,
    pairs_to_certify,
    sequential_measure,
    sequential_stop,
    stage_measured,
)
from teamtr.measured.confidence import (
    ANYTIME,
    BISECTION_TOLERANCE,
    BOUNDS,
    DEFAULT_BOUND,
    HEDGE_TRUNCATION,
    BoundName,
    anytime_bets,
    anytime_lower_bound,
    anytime_upper_bound,
    bernstein_lower_bound,
    betting_lower_bound,
    fixed_n_bets,
    hedged_lower_bound,
    log_hedged_capital,
    lower_bound,
)

__all__ = [
    "ANYTIME",
    "BISECTION_TOLERANCE",
    "BOUNDS",
    "DEFAULT_BOUND",
    "DEFAULT_LEVEL",
    "FUTILITY_RULES",
    "HEDGE_TRUNCATION",
    "STOPS",
    "BoundName",
    "MeasuredCertificate",
    "PairedDifferences",
    "anytime_bets",
    "anytime_lower_bound",
    "anytime_upper_bound",
    "bernstein_lower_bound",
    "betting_lower_bound",
    "fixed_n_bets",
    "hedged_lower_bound",
    "log_hedged_capital",
    "lower_bound",
    "measure",
    "pairs_to_certify",
    "sequential_measure",
    "sequential_stop",
    "stage_measured",
]
