"""Penalty constants of Theorem 3.4, for the discounted and the episodic setting.

A penalty model turns an update's advantage bound epsilon_i and its measured divergence
into the amount subtracted from the surrogate L_i. Both forms are upper bounds on
|J(pi_hat^i) - J(pi_hat^{i-1}) - L_i| (THEORY.md §2).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Protocol


class PenaltyModel(Protocol):
    def tv_penalty(self, advantage_bound: float, mean_tv: float) -> float:
        """Penalty from E_d[TV_i] (the tighter form of Thm 3.4)."""
        ...

    def kl_penalty(self, advantage_bound: float, mean_kl: float) -> float:
        """Penalty from E_d[KL_i] via Pinsker and Jensen: E[TV] <= sqrt(E[KL]/2)."""
        ...


@dataclass(frozen=True)
class DiscountedPenalty:
    """Discounted case, gamma in [0, 1): penalty = 2 gamma eps / (1-gamma)^2 * E_d[TV]."""

    gamma: float

    def __post_init__(self) -> None:
        if not 0.0 <= self.gamma < 1.0:
            raise ValueError(f"gamma must lie in [0, 1), got {self.gamma!r}")

    @property
    def tv_coefficient(self) -> float:
        # Thm 3.4: eps * ||d_new - d_old||_1 / (1-gamma), with the occupancy shift
        # ||d_new - d_old||_1 <= 2 gamma/(1-gamma) E_d[TV].
        return 2.0 * self.gamma / (1.0 - self.gamma) ** 2

    def tv_penalty(self, advantage_bound: float, mean_tv: float) -> float:
        return self.tv_coefficient * advantage_bound * mean_tv

    def kl_penalty(self, advantage_bound: float, mean_kl: float) -> float:
        # C_i sqrt(delta_i) with C_i = sqrt(2) gamma eps / (1-gamma)^2 (Thm 3.4, KL form).
        return self.tv_coefficient * advantage_bound * math.sqrt(max(mean_kl, 0.0) / 2.0)


@dataclass(frozen=True)
class EpisodicPenalty:
    """Episodic case, gamma = 1, horizon H.

    With per-step marginals rho_t and the average occupancy d = (1/H) sum_t rho_t:
    ||rho'_t - rho_t||_1 <= 2 sum_{u<t} E_{rho_u}[TV_u], so
    |J' - J - L| <= eps sum_t ||rho'_t - rho_t||_1 <= 2 eps sum_u (H-1-u) E_{rho_u}[TV_u]
                 <= 2 eps (H-1) H E_d[TV].
    """

    horizon: int

    def __post_init__(self) -> None:
        if self.horizon < 1:
            raise ValueError(f"horizon must be >= 1, got {self.horizon!r}")

    @property
    def tv_coefficient(self) -> float:
        return 2.0 * (self.horizon - 1) * self.horizon

    def tv_penalty(self, advantage_bound: float, mean_tv: float) -> float:
        return self.tv_coefficient * advantage_bound * mean_tv

    def kl_penalty(self, advantage_bound: float, mean_kl: float) -> float:
        return self.tv_coefficient * advantage_bound * math.sqrt(max(mean_kl, 0.0) / 2.0)
