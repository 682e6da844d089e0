"""The study configs that docs/results.md reads as "the default run" train what they say.

The default's trust region was widened (radius 0.5, learning rate 7e-4) on the evidence of
``study/relay_wide_region.toml``'s runs, so those runs are the default's own only if that config
differs from ``default.toml`` in nothing but when it stops, checkpoints and evaluates. And the
studies of the previous default (``default_every_stage``, ``default_to_90`` and the changes
separated) must still train the previous default, or their committed commands would print other
numbers than the pages do.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

from llm.common.config import load_config

CONFIGS = Path(__file__).resolve().parents[2] / "llm" / "configs"
RUN_BOOKKEEPING = {
    "output_dir",
    "threads",
    "time_budget_minutes",
    "budget_clock",
    "eval_every",
    "checkpoint_every",
}
"""[run] keys that decide when a run stops, where it writes and what it evaluates on the way,
not what it trains (an evaluation draws no training randomness: ``test_llm_evaluation_seeds``)."""


def training_settings(path: Path) -> dict:
    """Every resolved setting that decides the trained team: all but the stage count (a budget
    ends the study runs) and the run's bookkeeping."""
    settings = dataclasses.asdict(load_config(path))
    settings["stage"].pop("stages")
    for key in RUN_BOOKKEEPING:
        settings["run"].pop(key)
    return settings


def test_the_wide_region_runs_are_the_default_runs():
    assert training_settings(CONFIGS / "study" / "relay_wide_region.toml") == training_settings(
        CONFIGS / "default.toml"
    )


def test_the_default_has_the_wide_region():
    default = load_config(CONFIGS / "default.toml")
    assert (default.stage.radius, default.updater.learning_rate) == (0.5, 7e-4)


def test_the_previous_defaults_studies_still_train_the_previous_default():
    narrow = CONFIGS / "study" / "relay_narrow_region.toml"
    assert (load_config(narrow).stage.radius, load_config(narrow).updater.learning_rate) == (
        0.1,
        3e-4,
    )
    for name in ("default_every_stage", "default_to_90"):
        assert training_settings(CONFIGS / "study" / f"{name}.toml") == training_settings(narrow)
    # the changes separated: each differs from the previous default in its one change
    for name, change in (
        ("relay_dynamic_only", {("updater", "learning_rate"): 2e-4}),
        ("relay_lr_only", {("updater", "learning_rate"): 3e-4, ("sampler", "signal_groups"): 0}),
    ):
        settings, previous = (
            training_settings(CONFIGS / "study" / f"{name}.toml"),
            training_settings(narrow),
        )
        for (section, key), value in change.items():
            assert settings[section][key] == value
            previous[section][key] = value
        assert settings == previous, name
