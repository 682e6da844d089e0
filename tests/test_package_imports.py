"""Imports point one way: no circle among a package's modules, and no import across the layers.

Every module of ``teamtr``, ``sim``, ``llm`` and ``proofs_check`` is read with ``ast``, and every
import counts, wherever it stands: at the top, inside a function (a lazy import) or under
``TYPE_CHECKING``. ``from x import y`` is an edge to the module ``x.y`` where that is a module
and to ``x`` otherwise; ``import x.y`` is an edge to ``x.y``.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("teamtr", "sim", "llm", "proofs_check")
LAYERS = {
    # package: the packages of this project it must never import
    "teamtr": {"sim", "llm", "proofs_check"},
    "sim": {"llm"},
    "llm": {"sim"},
}


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _modules() -> dict[str, Path]:
    return {
        _module_name(path): path
        for package in PACKAGES
        for path in sorted((ROOT / package).rglob("*.py"))
        if "__pycache__" not in path.parts
    }


MODULES = _modules()


def _own_module(name: str) -> str | None:
    """``name`` or its longest prefix that is a module of this project; None for other imports."""
    parts = name.split(".")
    while parts:
        candidate = ".".join(parts)
        if candidate in MODULES:
            return candidate
        parts.pop()
    return None


def _imports(module: str, source: str, is_package: bool = False) -> set[str]:
    """The project modules that ``module`` (of this ``source``) imports anywhere in it."""
    targets: set[str] = set()
    for node in ast.walk(ast.parse(source, module)):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                package = module.split(".")
                if not is_package:
                    package.pop()
                package = package[: len(package) - (node.level - 1)]
                base = ".".join([*package, *([base] if base else [])])
            names = [f"{base}.{alias.name}" for alias in node.names]
            names = [name if name in MODULES else base for name in names]
        else:
            continue
        targets |= {own for own in map(_own_module, names) if own is not None}
    targets.discard(module)
    return targets


GRAPH = {
    module: _imports(module, path.read_text(), path.name == "__init__.py")
    for module, path in MODULES.items()
}


def _circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for target in sorted(graph[node]):
            if target not in index:
                visit(target)
                low[node] = min(low[node], low[target])
            elif target in on_stack:
                low[node] = min(low[node], index[target])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def test_every_package_is_read():
    for package in PACKAGES:
        assert package in MODULES
        assert sum(name.startswith(f"{package}.") for name in MODULES) >= 5, package
    assert "sim.experiments.swap" in MODULES and "sim.team" in GRAPH["sim.evaluate"]


def test_every_import_is_an_edge_wherever_it_stands():
    source = (
        "from typing import TYPE_CHECKING\n"
        "import numpy\n"
        "from . import agent_map\n"
        "from .mdp import TurnTakingMDP\n"
        "from sim.experiments import swap_summary\n"
        "if TYPE_CHECKING:\n"
        "    from sim.team import TabularTeam\n"
        "def f():\n"
        "    import sim.experiments.plots\n"
        "    from sim import TabularTeam, evaluate\n"
    )
    assert _imports("sim.probe", source) == {
        "sim",
        "sim.agent_map",
        "sim.mdp",
        "sim.team",
        "sim.evaluate",
        "sim.experiments.plots",
        "sim.experiments.swap_summary",
    }
    assert "sim.experiments.plots" in GRAPH["sim.experiments.swap"]  # imported inside run()


def test_the_circle_finder_finds_circles():
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}, "e": set()}
    assert _circles(graph) == [["a", "b", "c"]]


@pytest.mark.parametrize("package", PACKAGES)
def test_no_import_circle_among_the_modules_of_a_package(package):
    inside = {name for name in MODULES if name == package or name.startswith(f"{package}.")}
    graph = {name: GRAPH[name] & inside for name in inside}
    circles = _circles(graph)
    ties = {
        " <-> ".join(circle): {m: sorted(GRAPH[m] & set(circle)) for m in circle}
        for circle in circles
    }
    assert ties == {}


def test_no_import_circle_across_packages():
    assert _circles(GRAPH) == []


@pytest.mark.parametrize("package", sorted(LAYERS))
def test_no_import_across_the_layers(package):
    offenders = {
        module: sorted(target for target in targets if target.split(".")[0] in LAYERS[package])
        for module, targets in GRAPH.items()
        if module.split(".")[0] == package
    }
    assert {module: targets for module, targets in offenders.items() if targets} == {}


def test_no_module_loads_a_file_by_its_path():
    """A package that loads a script (``figures/``) by path breaks in a non-editable install."""
    offenders = sorted(
        module
        for module, path in MODULES.items()
        if any(
            isinstance(node, ast.Attribute | ast.Name)
            and (node.attr if isinstance(node, ast.Attribute) else node.id)
            == "spec_from_file_location"
            for node in ast.walk(ast.parse(path.read_text(), str(path)))
        )
    )
    assert offenders == []
