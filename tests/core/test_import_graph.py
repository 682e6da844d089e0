"""Imports point down: the core never imports a backend (sim, llm), the proofs or torch."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

CORE = Path(__file__).resolve().parents[2] / "teamtr"
FORBIDDEN = ("sim", "llm", "proofs_check", "torch")


def _imported_roots(path: Path) -> set[str]:
    roots = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            roots |= {alias.name.split(".")[0] for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            roots.add(node.module.split(".")[0])
    return roots


def test_no_module_of_the_core_imports_a_backend():
    modules = sorted(CORE.glob("*.py"))
    assert len(modules) >= 10
    offenders = {
        path.name: sorted(_imported_roots(path) & set(FORBIDDEN))
        for path in modules
        if _imported_roots(path) & set(FORBIDDEN)
    }
    assert offenders == {}


def test_the_stage_loop_on_a_numpy_backend_loads_no_backend():
    code = (
        "import sys\n"
        f"sys.path.insert(0, {str(Path(__file__).parent)!r})\n"
        "import teamtr, teamtr.cli\n"
        "from toy_backend import ToySampler, ToyUpdater, toy_game\n"
        "game = toy_game()\n"
        "sampler, updater = ToySampler(game), ToyUpdater()\n"
        "for scheme in teamtr.SCHEMES:\n"
        "    report, team = teamtr.run_stage(game.uniform_team(), sampler, updater,\n"
        "        teamtr.StageConfig(scheme=scheme, radius=0.05), game.penalty(), game.value)\n"
        "    assert report.realised_gain > 0, scheme\n"
        "teamtr.check_backend(game.uniform_team(), sampler, updater, radius=0.05)\n"
        f"print(sorted(m for m in {FORBIDDEN!r} if m in sys.modules))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"
