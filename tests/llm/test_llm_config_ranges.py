"""Every integer key has a range, checked by ``--check`` with the file, line and key: seeds,
sizes that would only exhaust the memory, and a team in which some agent never speaks."""

from __future__ import annotations

from pathlib import Path

import pytest
from llm_test_support import SMOKE

from llm.interface.cli import main


def smoke_with(tmp_path: Path, section: str, lines: str) -> Path:
    """configs/smoke.toml with ``lines`` (``key = value``) set in ``[section]``."""
    text = SMOKE.read_text().replace("[run]\n", f'[run]\noutput_dir = "{tmp_path / "runs"}"\n')
    out, current = [], ""
    keys = {line.split(" = ")[0] for line in lines.splitlines()}
    for line in text.splitlines():
        if line.startswith("["):
            current = line.strip("[]")
        if current == section and line.split(" = ")[0] in keys:
            continue  # replaced below
        out.append(line)
        if line == f"[{section}]":
            out.extend(lines.splitlines())
    path = tmp_path / "run.toml"
    path.write_text("\n".join(out) + "\n")
    return path


def line_of(path: Path, text: str) -> int:
    return next(n for n, line in enumerate(path.read_text().splitlines(), 1) if line == text)


def check(path: Path, capsys) -> tuple[int, str]:
    code = main(["train", "--config", str(path), "--check", "--no-progress"])
    return code, capsys.readouterr().err


@pytest.mark.parametrize(
    ("section", "line", "expected"),
    [
        ("run", "seed = -1", "must be >= 0 and <= 2147483647 (a seed), got -1"),
        ("run", "seed = 4294967296", "(a seed), got 4294967296"),
        ("sampler", "seed = -1", "(a seed), got -1"),
        ("sampler", "seed = 2147483648", "(a seed), got 2147483648"),
        ("task", "eval_seed = -5", "(a seed), got -5"),
        ("team", "n_agents = 1000000", "must be >= 1 and <= 64 (n, the number of agents)"),
        ("task", "eval_size = 1000000000", "must be <= 1000 for the built-in tasks"),
        ("sampler", "max_new_tokens = 1000000000000", "must be >= 1 and <= 1048576"),
        ("stage", "stages = 99999999999", "must be <= 2147483647, got 99999999999"),
        ("run", "threads = 100000", "must be >= 0 and <= 1024"),
        ("lora", "rank = 100000", "must be >= 1 and <= 4096"),
        ("task", "note_holders = 1000", "must be >= 0 and <= 64"),
    ],
)
def test_an_integer_out_of_range_names_file_line_and_key(tmp_path, capsys, section, line, expected):
    path = smoke_with(tmp_path, section, line)
    code, err = check(path, capsys)
    key = line.split(" = ")[0]
    assert code == 2
    assert err.startswith(f"error: {path}:{line_of(path, line)}: [{section}] {key}: ")
    assert expected in err and "Traceback" not in err and err.count("\n") == 1
    assert not (tmp_path / "runs").exists()


def test_the_largest_seed_and_team_pass_the_check(tmp_path, capsys):
    path = smoke_with(tmp_path, "run", "seed = 2147483647")
    assert check(path, capsys) == (0, "")


@pytest.mark.parametrize(
    ("team", "sampler", "key", "expected"),
    [
        ("n_agents = 3", "turns = 2", "turns", "agent(s) [2] never speak in 2 turns"),
        ('n_agents = 3\nrouter = "random"', "turns = 2", "turns", "must be >= [team] n_agents"),
        ('n_agents = 3\nrouter = "handoff"', "turns = 2", "turns", "must be >= [team] n_agents"),
        ("n_agents = 3\nspeaking_order = [0, 1]", "turns = 5", "speaking_order", "[2] never"),
        ("n_agents = 2\nspeaking_order = [0, 0, 1]", "turns = 2", "turns", "must be >= 3"),
    ],
)
def test_every_agent_must_get_a_turn(tmp_path, capsys, team, sampler, key, expected):
    path = smoke_with(tmp_path, "team", team)
    path.write_text(path.read_text().replace("turns = 2\n", f"{sampler}\n"))
    code, err = check(path, capsys)
    section = "sampler" if key == "turns" else "team"
    written = next(line for line in (team + "\n" + sampler).splitlines() if line.startswith(key))
    assert code == 2
    assert err.startswith(f"error: {path}:{line_of(path, written)}: [{section}] {key}: ")
    assert expected in err


def test_three_agents_with_three_turns_pass(tmp_path, capsys):
    path = smoke_with(tmp_path, "team", "n_agents = 3")
    path.write_text(path.read_text().replace("turns = 2\n", "turns = 3\n"))
    assert check(path, capsys) == (0, "")
