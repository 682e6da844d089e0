"""The README's Python snippets run as printed: the tabular stage prints exactly the line shown
under it, and the language-model stage (tiny model) runs through the same ``run_stage`` call."""

from __future__ import annotations

import ast
import math
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def python_snippets() -> list[str]:
    return re.findall(r"```python\n(.*?)```", (ROOT / "README.md").read_text(), re.DOTALL)


def run_snippet(code: str) -> str:
    environment = {**os.environ, "OMP_NUM_THREADS": "1"}
    out = subprocess.run(
        [sys.executable, "-c", code],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
        env=environment,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    return out.stdout


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
    "page", ["ARCHITECTURE.md", "docs/tabular_results.md", "docs/llm_results.md"]
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
