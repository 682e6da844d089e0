"""Log-log exponent fits; they live in the core (``teamtr.fitting``), shared with the
language-model drift study."""

from teamtr.fitting import ExponentFit, finite_or_none, fit_exponent, loglog_slope

__all__ = ["ExponentFit", "finite_or_none", "fit_exponent", "loglog_slope"]
