"""The comparison summary reads real run directories and evaluation files."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from llm.interface.cli import main as teamtr_llm
from studies.llm.compare_report import main
from studies.llm.run_records import binomial_standard_error

REPO = Path(__file__).resolve().parents[2]


def test_summary_and_figure_of_a_real_tiny_run(tmp_path):
    text = (REPO / "configs" / "smoke.toml").read_text()
    config = tmp_path / "smoke.toml"
    config.write_text(text.replace("[run]\n", f'[run]\noutput_dir = "{tmp_path / "runs"}"\n'))
    assert teamtr_llm(["train", "--config", str(config), "--name", "a", "--no-progress"]) == 0
    run_dir = tmp_path / "runs" / "a"
    trained, untrained = tmp_path / "trained.json", tmp_path / "untrained.json"
    assert teamtr_llm(["eval", "--run", str(run_dir), "--json", str(trained)]) == 0
    assert teamtr_llm(["eval", "--config", str(config), "--json", str(untrained)]) == 0
    out, figure = tmp_path / "summary.json", tmp_path / "compare.png"
    spec = f"tiny={run_dir}:{trained}:{untrained}"
    assert main(["--run", spec, "--out", str(out), "--plot", str(figure)]) == 0
    run = json.loads(out.read_text())["runs"]["tiny"]
    assert run["stages_trained"] == 2 and [s["stage"] for s in run["stages"]] == [0, 1]
    assert run["scheme"] == "teamtr" and run["n_agents"] == 2
    assert run["budget_clock_minutes_used"] > 0  # from the newest checkpoint's state
    evaluation = json.loads(trained.read_text())
    assert run["trained"]["accuracy"] == evaluation["accuracy"]
    assert figure.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    # "-": the evaluation the run made itself at its end (smoke.toml evaluates every stage)
    assert main(["--run", f"tiny={run_dir}:-:{untrained}", "--out", str(out)]) == 0
    final = json.loads((run_dir / "metrics.jsonl").read_text().splitlines()[-1])["eval"]
    assert json.loads(out.read_text())["runs"]["tiny"]["trained"]["accuracy"] == final["accuracy"]


def test_binomial_standard_error():
    assert binomial_standard_error(0.2, 200) == pytest.approx(math.sqrt(0.2 * 0.8 / 200), 1e-12)
    assert binomial_standard_error(0.0, 10) == 0.0


def test_a_malformed_run_argument_is_refused(capsys):
    with pytest.raises(SystemExit):
        main(["--run", "nameonly", "--out", "x.json"])
    assert "NAME=RUN_DIR" in capsys.readouterr().err
