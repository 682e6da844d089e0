"""Fuzzing config files: every key of configs/reference.toml, set to values of every kind.

Each file (five per key) is configs/smoke.toml (a tiny model, so that ``--check`` is quick) with one key of
the reference config replaced by a drawn value: integers from negative to the 64-bit limit,
floats including NaN and infinities, strings, booleans, lists and tables where a scalar
belongs. ``teamtr train --config F --check`` must exit 0, or exit 2 with one ``error:`` line
that names the key; never a traceback. What it accepts, a run can seed.
"""

from __future__ import annotations

import random
import tomllib
from pathlib import Path

import numpy as np
import pytest
from llm_test_support import SMOKE

from llm.common.config import load_config
from llm.interface.cli import main
from llm.training.builder import seed_everything

REPO = Path(__file__).resolve().parents[2]
REFERENCE = REPO / "configs" / "reference.toml"
PER_KEY = 5
"""Values drawn for each key (in-process ``--check`` takes milliseconds a file)."""

VALUES = [
    "-1",
    "0",
    "1",
    "3",
    "64",
    "65",
    "2147483648",
    "4294967296",
    "9223372036854775807",
    "-9223372036854775808",
    "1000000000000",
    "nan",
    "inf",
    "-inf",
    "1e308",
    "-0.5",
    "0.5",
    "1.5",
    '""',
    '"x"',
    '"../up"',
    '"tiny"',
    '"cuda:7"',
    "true",
    "false",
    "[]",
    "[1, 2]",
    '[1, "a"]',
    "[-1, 0]",
    "[0.1, nan]",
    "{ a = 1 }",
]


def reference_keys() -> list[tuple[str, str]]:
    data = tomllib.loads(REFERENCE.read_text())
    return [(section, key) for section, table in data.items() for key in table]


def with_value(section: str, key: str, value: str, output_dir: Path) -> str:
    """smoke.toml with ``key = value`` in ``[section]`` (replacing a line there, if any)."""
    lines, current, placed = [], "", False
    text = SMOKE.read_text().replace("[run]\n", f'[run]\noutput_dir = "{output_dir}"\n')
    if key == "output_dir" and section == "run":
        text = text.replace(f'output_dir = "{output_dir}"\n', "")
    if f"[{section}]" not in text:
        text += f"\n[{section}]\n"
    for line in text.splitlines():
        if line.startswith("["):
            current = line.strip("[]")
        if current == section and line.split("=")[0].strip() == key:
            continue
        lines.append(line)
        if line == f"[{section}]" and not placed:
            lines.append(f"{key} = {value}")
            placed = True
    return "\n".join(lines) + "\n"


def cases() -> list[tuple[str, str, str]]:
    draw = random.Random(18)
    return [
        (section, key, value)
        for section, key in reference_keys()
        for value in draw.sample(VALUES, PER_KEY)
    ]


def test_the_reference_config_has_more_keys_than_a_handful():
    assert len(reference_keys()) >= 40  # the fuzz below draws from every one of them


@pytest.mark.parametrize(("section", "key", "value"), cases())
def test_a_config_file_with_any_value_checks_cleanly(
    tmp_path, capsys, monkeypatch, section, key, value
):
    monkeypatch.chdir(tmp_path)  # a relative output_dir stays in the test's directory
    path = tmp_path / "fuzz.toml"
    path.write_text(with_value(section, key, value, tmp_path / "runs"))
    code = main(["train", "--config", str(path), "--check", "--no-progress"])
    out, err = capsys.readouterr()
    assert code in (0, 2), err
    assert "Traceback" not in err and "Traceback" not in out
    if code == 2:
        assert err.startswith("error: ") and err.count("\n") == 1, err
        assert key in err, f"{section}.{key} = {value}: {err}"
    else:
        assert err == ""
        # What --check accepts, a run can start with: its seeds seed every generator.
        config = load_config(path)
        seed_everything(config.run.seed)
        np.random.default_rng([config.sampler.seed, config.task.eval_seed])
        np.random.seed(config.sampler.seed + config.team.n_agents)  # noqa: NPY002
    assert not (tmp_path / "runs").exists()  # --check writes nothing
