"""The README's Python snippets run as printed: the tabular stage prints exactly the line shown
under it, and the language-model stage (tiny model) runs through the same ``run_stage`` call.

The README's ```python blocks are the two quick-start snippets, and both run here. The section
"Train a team on your own task" shows its Python files as ```py blocks: they must compile, its
TOML must parse, and, in a version whose ``llm`` has the task API, the names it uses must exist
and its config, data and reward must pass ``teamtr train --check``. Links from the README into
docs/results.md name headings that exist there.
"""

from __future__ import annotations

import ast
import json
import math
import os
import re
import subprocess
import sys
import unicodedata
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def python_snippets() -> list[str]:
    return blocks("python")


def blocks(language: str, text: str | None = None) -> list[str]:
    """The README's fenced blocks of one language (```python, ```py, ```toml), in order."""
    text = (ROOT / "README.md").read_text() if text is None else text
    return re.findall(rf"```{language}\n(.*?)```", text, re.DOTALL)


def own_task_section() -> str:
    text = (ROOT / "README.md").read_text()
    start = text.index("## Train a team on your own task")
    return text[start : text.index("\n## ", start + 1)]


def github_anchor(heading: str) -> str:
    """The fragment GitHub gives a heading: lower case; letters, decimal digits, marks, ``-``
    and ``_`` kept, other characters dropped (``²`` and ``→`` too); each space a hyphen
    (``"Training at n = 4: where"`` -> ``"training-at-n--4-where"``)."""
    kept = "".join(
        c
        for c in heading.lower()
        if c in " -_" or unicodedata.category(c)[0] == "L" or unicodedata.category(c) in KEPT
    )
    return kept.replace(" ", "-")


KEPT = {"Nd", "Mn", "Mc"}
"""Unicode categories besides letters that a GitHub heading fragment keeps."""


def run_python(arguments: list[str], cwd: Path = ROOT, path: str = "") -> str:
    """What ``python <arguments>`` prints, in a fresh interpreter in ``cwd`` (``path``: its
    PYTHONPATH); it must exit 0."""
    environment = {**os.environ, "OMP_NUM_THREADS": "1"}
    if path:
        environment["PYTHONPATH"] = path
    out = subprocess.run(
        [sys.executable, *arguments],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=600,
        env=environment,
    )
    assert out.returncode == 0, (arguments[:4], out.stderr[-3000:])
    return out.stdout


def run_snippet(code: str, cwd: Path = ROOT, path: str = "") -> str:
    """What ``code`` prints, run in a fresh interpreter."""
    return run_python(["-c", code], cwd, path)


def test_the_readme_has_a_tabular_and_a_language_model_snippet():
    snippets = python_snippets()
    assert len(snippets) == 2
    assert "import sim" in snippets[0] and "import llm" in snippets[1]
    assert all("run_stage(" in snippet for snippet in snippets)


def test_the_tabular_snippet_prints_the_line_shown_under_it():
    code = python_snippets()[0]
    expected = [line[2:] for line in code.splitlines() if line.startswith("# J ")]
    assert len(expected) == 1
    assert run_snippet(code).splitlines() == expected


def test_the_language_model_snippet_trains_a_tiny_team():
    code = python_snippets()[1]
    printed = run_snippet(code).strip().splitlines()
    assert len(printed) == 1
    match = re.fullmatch(r"(\d+) updates, kept (\d+), certificate (\S+)", printed[0])
    assert match is not None, printed
    updates, kept = int(match[1]), int(match[2])
    assert updates == 2 and 0 <= kept <= updates  # configs/smoke.toml: a team of two agents
    certificate = float(match[3])
    assert math.isfinite(certificate), printed  # float() accepts "nan" and "inf"
    if kept == 0:
        assert certificate == 0.0, printed  # a stage that keeps nothing certifies nothing


def test_the_smollm2_line_of_the_snippet_names_valid_settings():
    """The commented SmolLM2 variant is not run (a real stage takes minutes; the slow smoke
    test runs one), but its keywords must be config keys build_team accepts."""
    from llm.common.config import RunConfig
    from llm.training.builder import configured

    line = next(
        line
        for line in python_snippets()[1].splitlines()
        if line.startswith("# team") and "build_team(" in line
    )
    call = ast.parse(line[2:].split("#")[0].strip()).body[0]
    assert isinstance(call, ast.Assign) and isinstance(call.value, ast.Call)
    settings = {k.arg: ast.literal_eval(k.value) for k in call.value.keywords}
    assert settings == {"source": "smollm2"}
    assert configured(RunConfig(), settings).model.source == "smollm2"


@pytest.mark.parametrize(
    "page", ["ARCHITECTURE.md", "docs/results.md", "docs/tabular_results.md", "docs/llm_results.md"]
)
def test_every_local_link_and_figure_of_the_front_door_exists(page):
    for document in ("README.md", page):
        text = (ROOT / document).read_text()
        for target in re.findall(r"\]\(([^)#]+)\)", text):
            if "://" not in target:
                assert (ROOT / document).parent.joinpath(target).resolve().exists(), (
                    document,
                    target,
                )


def test_every_link_into_the_results_page_names_one_of_its_headings():
    readme = (ROOT / "README.md").read_text()
    page = (ROOT / "docs" / "results.md").read_text()
    headings = re.findall(r"^#{1,6} (.+)$", page, re.MULTILINE)
    anchors = {github_anchor(heading) for heading in headings}
    assert (
        "the-n-versus-n-drift-thm-37-exact" in anchors
    )  # "The n² versus n drift (Thm 3.7), exact"
    linked = re.findall(r"\]\(docs/results\.md#([^)]+)\)", readme)
    assert len(linked) >= 10
    assert set(linked) <= anchors, set(linked) - anchors


def test_the_own_task_section_shows_a_config_a_reward_and_the_python_api():
    import tomllib

    section = own_task_section()
    (config,) = blocks("toml", section)
    settings = tomllib.loads(config)
    assert settings["team"]["n_agents"] == len(settings["team"]["role_prompts"]) == 2
    task = settings["task"]
    assert task["kind"] == "dataset" and task["reward"] == "my_reward:score"
    assert {"train_file", "test_file", "question_column", "answer_column"} <= task.keys()
    reward, program = blocks("py", section)
    for code in (reward, program):
        compile(code, "README.md", "exec")
    assert "def score(dialogue" in reward
    for name in ("llm.Task(", "llm.Problem(", "llm.check_task(", "llm.build_team(", "run_stage("):
        assert name in program, name
    assert "teamtr train --config my_team.toml --check" in section


def test_the_names_of_the_own_task_section_exist():
    import inspect

    import llm

    assert callable(llm.check_task) and callable(llm.Task)
    problem = llm.Problem("What is 2 + 3?", "5")
    assert (problem.question, problem.answer) == ("What is 2 + 3?", "5")
    assert hasattr(problem, "notes") and hasattr(problem, "metadata")
    fields = inspect.signature(llm.Dialogue).parameters
    assert {"problem", "messages", "speakers"} <= fields.keys(), fields
    assert hasattr(llm.Dialogue, "final")


def own_task_folder(tmp_path: Path) -> str:
    """The README's config and reward with a small data set in ``tmp_path``; the config."""
    section = own_task_section()
    (config,) = blocks("toml", section)
    (tmp_path / "my_reward.py").write_text(blocks("py", section)[0])
    for name, numbers in (("train.jsonl", range(1, 21)), ("test.jsonl", range(21, 31))):
        lines = [
            json.dumps({"question": f"What is {n} + 1?", "answer": str(n + 1)}) for n in numbers
        ]
        (tmp_path / name).write_text("\n".join(lines) + "\n")
    return config


def test_the_own_task_config_and_reward_pass_the_check(tmp_path, monkeypatch, capsys):
    """The README's ``my_team.toml`` and ``my_reward.py``, with a small data set, pass
    ``teamtr train --config my_team.toml --check`` as written (the console script's function,
    from the folder that holds them)."""
    from teamtr.cli import main

    (tmp_path / "my_team.toml").write_text(own_task_folder(tmp_path))
    monkeypatch.chdir(tmp_path)
    assert main(["train", "--config", "my_team.toml", "--check"]) == 0
    assert "dialogues played on a tiny random model" in capsys.readouterr().out


def test_the_own_task_commands_train_and_evaluate_on_the_tiny_model(tmp_path, monkeypatch):
    """``teamtr train --config my_team.toml`` and ``teamtr eval --run ...`` as the README shows
    them (the console script's function, from the folder of the config), on the tiny model (one
    stage of small batches)."""
    from teamtr.cli import main

    tiny = '[model]\nsource = "tiny"\n[sampler]\nprompts_per_batch = 2\ngroup_size = 2\n'
    tiny += 'max_new_tokens = 4\n[stage]\nstages = 1\n[run]\nname = "mine"\n'
    (tmp_path / "my_team.toml").write_text(own_task_folder(tmp_path) + tiny)
    section = own_task_section()
    commands = [
        line.split("#")[0].split()
        for block in blocks("bash", section)
        for line in block.splitlines()
        if line.startswith("teamtr ")
    ]
    assert [c[:2] for c in commands] == [["teamtr", "train"]] * 2 + [["teamtr", "eval"]]
    monkeypatch.chdir(tmp_path)
    for command in commands:
        command = [a.replace("runs/<name>", "runs/mine") for a in command]
        assert main([*command[1:], "--no-progress"]) == 0, command
    assert 0 <= json.loads((tmp_path / "eval.json").read_text())["accuracy"] <= 1


def test_the_own_task_python_program_runs_on_the_tiny_model(tmp_path):
    own_task_folder(tmp_path)
    program = blocks("py", own_task_section())[1]
    assert program.count('source="smollm2"') == 1
    code = program.replace('source="smollm2"', 'source="tiny"') + "\nprint(len(report.records))\n"
    printed = run_snippet(code, tmp_path, f"{ROOT}:{tmp_path}")
    assert printed.split()[-1] == "2"  # one update per agent of the two-agent team
