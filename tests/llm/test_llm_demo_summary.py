"""The language-model part of ``make demo``: configs/demo.toml is the default relay cut to 2
stages, and ``studies.llm.demo_summary`` reports a tiny team's held-out accuracy before (``teamtr
eval --config``) and after (the run's last evaluation) training, from real runs."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from llm.common.config import load_config
from llm.interface.cli import main as teamtr
from studies.llm.demo_summary import main, summary_line

REPO = Path(__file__).resolve().parents[2]


def tiny_config(tmp_path: Path, name: str = "tiny.toml", **replaced: str) -> Path:
    """configs/smoke.toml (2 stages, an evaluation after each, 4 held-out problems) writing
    under ``tmp_path``, with lines replaced as ``old=new``."""
    text = (REPO / "configs" / "smoke.toml").read_text()
    text = text.replace("[run]\n", f'[run]\noutput_dir = "{tmp_path / "runs"}"\n')
    for old, new in replaced.items():
        assert old in text
        text = text.replace(old, new)
    path = tmp_path / name
    path.write_text(text)
    return path


def untrained_eval(config: Path, out: Path) -> Path:
    assert teamtr(["eval", "--config", str(config), "--json", str(out), "--no-progress"]) == 0
    return out


def trained_run(config: Path, name: str) -> Path:
    assert teamtr(["train", "--config", str(config), "--name", name, "--no-progress"]) == 0
    return config.parent / "runs" / name


def test_the_demo_config_is_the_default_relay_in_two_stages_on_one_thread():
    demo = load_config("demo")
    default = load_config("default")
    assert demo.stage.stages == 2 and demo.task.eval_size == 50 and demo.run.threads == 1
    assert demo.run.output_dir == "runs/demo" and demo.run.name == ""  # a fresh name per run
    assert demo.run.eval_every and demo.stage.stages % demo.run.eval_every == 0  # evaluated last
    # Everything else is the default run's: the same team, task, sampler and updater.
    as_default = dataclasses.replace(
        demo,
        task=dataclasses.replace(demo.task, eval_size=default.task.eval_size),
        stage=dataclasses.replace(demo.stage, stages=default.stage.stages),
        run=dataclasses.replace(
            demo.run, output_dir=default.run.output_dir, threads=default.run.threads
        ),
    )
    assert as_default == default


@pytest.mark.parametrize("command", ["train", "eval"])
def test_the_demo_commands_pass_their_checks(command, tmp_path):
    where = (
        ["--output-dir", str(tmp_path), "--name", "demo-x"]
        if command == "train"
        else ["--json", str(tmp_path / "untrained.json")]
    )
    assert teamtr([command, "--config", "demo", *where, "--check"]) == 0
    assert list(tmp_path.iterdir()) == []


def test_before_and_after_are_the_untrained_eval_and_the_runs_last(tmp_path, capsys):
    config = tiny_config(tmp_path)
    untrained = untrained_eval(config, tmp_path / "untrained.json")
    run_dir = trained_run(config, "r")
    capsys.readouterr()
    out = tmp_path / "results" / "demo_llm.json"
    assert main(["--untrained", str(untrained), "--run", str(run_dir), "--json", str(out)]) == 0
    printed = capsys.readouterr().out
    summary = json.loads(out.read_text())
    before = json.loads(untrained.read_text())
    stages = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert summary["untrained"]["accuracy"] == before["accuracy"]
    assert summary["untrained"]["standard_error"] == before["standard_error"]
    assert summary["trained"] == stages[-1]["eval"]
    assert summary["stages"] == 2 and summary["n"] == 4 and summary["run"] == str(run_dir)
    assert summary["team"] == "arithmetic, tiny:128x2, 2 stages"  # the smoke config's model
    assert summary["training_cpu_seconds"] == sum(s["cpu_seconds"] for s in stages)
    assert printed == summary_line(summary) + "\n"
    assert printed.startswith(
        "language-model team (arithmetic, tiny:128x2, 2 stages): held-out accuracy "
    )
    assert f"{before['accuracy']:.2f} -> {stages[-1]['eval']['accuracy']:.2f} (n = 4," in printed


def test_the_last_evaluation_counts_when_not_every_stage_is_evaluated(tmp_path, capsys):
    config = tiny_config(
        tmp_path, **{"stages = 2": "stages = 3", "eval_every = 1": "eval_every = 2"}
    )
    untrained = untrained_eval(config, tmp_path / "untrained.json")
    run_dir = trained_run(config, "r")
    stages = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert ["eval" in s for s in stages] == [False, True, True]  # stage 2, then the last
    out = tmp_path / "summary.json"
    assert main(["--untrained", str(untrained), "--run", str(run_dir), "--json", str(out)]) == 0
    summary = json.loads(out.read_text())
    assert summary["stages"] == 3 and summary["trained"] == stages[-1]["eval"]


def test_bad_input_is_one_line_and_exit_2(tmp_path, capsys):
    config = tiny_config(tmp_path)
    run_dir = trained_run(config, "r")
    other_set = untrained_eval(
        tiny_config(tmp_path, "five.toml", **{"eval_size = 4": "eval_size = 5"}),
        tmp_path / "five.json",
    )
    trained_eval = tmp_path / "trained.json"
    assert teamtr(["eval", "--run", str(run_dir), "--json", str(trained_eval)]) == 0
    never = trained_run(tiny_config(tmp_path, "never.toml", **{"eval_every = 1": "eval_every = 0"}),
                        "never")  # fmt: skip
    untrained = untrained_eval(config, tmp_path / "untrained.json")
    capsys.readouterr()
    cases = [
        (other_set, run_dir, "different held-out sets"),
        (trained_eval, run_dir, "not the untrained team"),
        (untrained, never, "no stage was evaluated"),
        (tmp_path / "none.json", run_dir, "no such file"),
        (untrained, tmp_path / "runs" / "none", "no such file"),
    ]
    out = tmp_path / "out.json"
    for before, run, message in cases:
        assert main(["--untrained", str(before), "--run", str(run), "--json", str(out)]) == 2
        captured = capsys.readouterr()
        assert captured.out == "" and captured.err.count("\n") == 1, message
        assert captured.err.startswith("error: ") and message in captured.err
        assert not out.exists()
