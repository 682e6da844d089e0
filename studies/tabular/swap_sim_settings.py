"""The options of ``teamtr swap-sim`` (``studies.tabular.swap_sim``), validated once.

``StudySettings`` is read by the study and by its summary (``studies.tabular.swap_sim_summary``);
``REPLACEMENTS`` names the kinds of replacement agent the study can drop into a team.
"""

from __future__ import annotations

import argparse
import math
from dataclasses import dataclass

from studies import options
from studies.tabular.families import FAMILIES

REPLACEMENTS: dict[str, str] = {
    "other-run": (
        "agent k of a donor team trained with TeamTR from another random start for "
        "--donor-stages stages (another run, trained longer)"
    ),
    "other-team": (
        "agent k trained alone for --donor-stages trust-region updates as a best response to a "
        "different, frozen team of peaked random policies (good for other teammates)"
    ),
}


@dataclass(frozen=True)
class StudySettings:
    """The options of one study, validated once."""

    family: str
    seeds: int
    train_stages: int
    donor_stages: int
    further_stages: int
    radius: float
    delta0: float
    sweep: tuple[float, ...]
    agent: int | None
    concentration: float
    replacement: str

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> StudySettings:
        if args.replacement not in REPLACEMENTS:
            raise ValueError(
                f"--replacement must be one of {sorted(REPLACEMENTS)}, got {args.replacement!r}"
            )
        if args.family not in FAMILIES:
            raise ValueError(f"--family must be one of {sorted(FAMILIES)}, got {args.family!r}")
        problem = options.first_problem(
            options.seed_count_problem(args.seeds), options.radius_problem(args.radius)
        )
        if problem is not None:
            raise ValueError(problem)
        for flag in ("train_stages", "donor_stages", "further_stages"):
            if getattr(args, flag) < 1:
                raise ValueError(f"--{flag.replace('_', '-')} must be >= 1")
        sweep = tuple(float(x) for x in args.delta0_sweep.split(",") if x.strip())
        for value in (args.delta0, args.concentration, *sweep):
            if not (math.isfinite(value) and value > 0):
                raise ValueError(
                    f"--delta0, --delta0-sweep and --concentration must be > 0, got {value}"
                )
        return cls(
            family=args.family,
            seeds=args.seeds,
            train_stages=args.train_stages,
            donor_stages=args.donor_stages,
            further_stages=args.further_stages,
            radius=args.radius,
            delta0=args.delta0,
            sweep=tuple(sorted({*sweep, float(args.delta0)})),
            agent=args.agent,
            concentration=args.concentration,
            replacement=args.replacement,
        )
