"""The team-size study's configs (docs/eight_agents.md): every file of llm/configs/eight/ and
llm/configs/two/ passes ``teamtr train --check``, and each is the step-size map's config of its
scheme at delta = 0.2 (llm/configs/stepsize/) except the keys that follow from n (and, at
n = 8, the budget: docs/eight_agents.md)."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from llm.common.config import load_config
from llm.interface.cli import main

CONFIGS = Path(__file__).resolve().parents[2] / "llm" / "configs"
STUDY = sorted((CONFIGS / "eight").glob("*.toml")) + sorted((CONFIGS / "two").glob("*.toml"))
PARTNER = {
    "stale_d02": "stale_d02",
    "teamtr_d02": "teamtr_d02",
    "happo_d02": "happo_d02",
    "teamtr_noradius_d02": "teamtr_d02",
}
FROM_N = {"team.n_agents", "team.system_prompt", "task.args", "sampler.turns", "run.output_dir"}


def flat(section: object, prefix: str = "") -> dict[str, object]:
    out: dict[str, object] = {}
    for f in dataclasses.fields(section):
        value = getattr(section, f.name)
        if dataclasses.is_dataclass(value):
            out.update(flat(value, f"{prefix}{f.name}."))
        else:
            out[prefix + f.name] = value
    return out


def test_the_study_has_its_configs():
    names = {p.relative_to(CONFIGS).as_posix() for p in STUDY}
    assert {f"eight/{name}.toml" for name in PARTNER} <= names
    assert {"two/stale_d02.toml", "two/teamtr_d02.toml"} <= names


@pytest.mark.parametrize("path", STUDY, ids=lambda p: p.relative_to(CONFIGS).as_posix())
def test_every_config_passes_the_check(path):
    assert main(["train", "--config", str(path), "--check"]) == 0


@pytest.mark.parametrize(
    "path",
    [p for p in STUDY if p.stem in PARTNER],
    ids=lambda p: p.relative_to(CONFIGS).as_posix(),
)
def test_each_is_the_maps_config_but_for_n(path):
    n = 8 if path.parent.name == "eight" else 2
    ours = flat(load_config(path))
    maps = flat(load_config(CONFIGS / "stepsize" / f"{PARTNER[path.stem]}.toml"))
    differ = {key for key in ours if ours[key] != maps[key]}
    expected = FROM_N | ({"stage.radius"} if "noradius" in path.stem else set())
    expected |= {"run.time_budget_minutes"} if n == 8 else set()
    assert differ == expected
    assert ours["team.n_agents"] == ours["sampler.turns"] == ours["task.args"]["n_agents"] == n
    assert ours["task.args"]["note_max"] == maps["task.args"]["note_max"] == 50
    assert ours["updater.learning_rate"] == 4.5e-4
    assert ours["stage.radius"] == (1000.0 if "noradius" in path.stem else 0.2)
    assert ours["run.time_budget_minutes"] == (64.0 if n == 8 else 8.0)
    assert ours["run.budget_clock"] == "cpu" and ours["run.threads"] == 1
