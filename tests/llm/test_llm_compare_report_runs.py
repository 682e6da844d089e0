"""``teamtr compare-report`` from run directories alone: the untrained evaluation is optional,
and a wrong argument is one line and exit code 2 (the real console script in a subprocess, so
that its whole stderr is read; a run is summarised through the console script's function)."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

from llm_test_support import teamtr

from llm.interface.cli import main as teamtr_llm
from teamtr.cli import main as teamtr_main


def compare_report(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return teamtr("compare-report", *args, cwd=cwd, timeout=300)


def test_a_run_alone_is_summarised_and_drawn(tmp_path, monkeypatch):
    sets = ["--set", "stage.stages=1", "--set", f"run.output_dir={json.dumps(str(tmp_path))}"]
    assert teamtr_llm(["train", "--config", "smoke", *sets, "--name", "a", "--no-progress"]) == 0
    out, figure = tmp_path / "summary.json", tmp_path / "compare.png"
    monkeypatch.chdir(tmp_path)
    drawn = ["--run", f"a={tmp_path / 'a'}", "--out", str(out), "--plot", str(figure)]
    assert teamtr_main(["compare-report", *drawn]) == 0
    run = json.loads(out.read_text())["runs"]["a"]
    final = json.loads((tmp_path / "a" / "metrics.jsonl").read_text().splitlines()[-1])["eval"]
    assert run["untrained"] is None and run["trained"]["accuracy"] == final["accuracy"]
    assert run["stages_trained"] == 1
    assert figure.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_a_wrong_argument_is_exit_2_and_one_line(tmp_path):
    out = str(tmp_path / "summary.json")
    missing = compare_report("--run", f"a={tmp_path / 'nowhere'}", "--out", out, cwd=tmp_path)
    assert (
        missing.returncode == 2 and "--run a:" in missing.stderr and "cannot read" in missing.stderr
    )
    assert len(missing.stderr.strip().splitlines()) == 1 and not Path(out).exists()
    malformed = compare_report("--run", "nameonly", "--out", out, cwd=tmp_path)
    assert malformed.returncode == 2 and "NAME=RUN_DIR" in malformed.stderr
    too_many = compare_report("--run", "a=r:t.json:u.json:x", "--out", out, cwd=tmp_path)
    assert too_many.returncode == 2
