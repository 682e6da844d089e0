"""Imports point one way: no circle among a package's modules, and no import across the layers.

The floors, bottom to top: the core ``teamtr``; the backends and the proofs ``sim``, ``llm``,
``proofs_check``; the studies ``studies``. A package imports only floors below its own (and
``proofs_check`` the tabular backend it checks), never one above; ``sim`` and ``llm`` never
import each other, and the tabular studies never import the language-model world.

Every module of these packages is read with ``ast``, and every import counts, wherever it
stands: at the top, inside a function (a lazy import) or under ``TYPE_CHECKING``.
``from x import y`` is an edge to the module ``x.y`` where that is a module and to ``x``
otherwise; ``import x.y`` is an edge to ``x.y``. Every package (and sub-package) says what it
holds in its docstring and stays small enough to read.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("teamtr", "sim", "llm", "proofs_check", "studies")
FLOORS = {"teamtr": 0, "sim": 1, "llm": 1, "proofs_check": 1, "studies": 2}
"""The floor of every package: imports go to a lower floor (or, within a floor, as ``LAYERS``
allows), never to a higher one."""
LAYERS = {
    # package (or sub-package): the packages of this project it must never import
    "teamtr": {"sim", "llm", "proofs_check", "studies"},
    "sim": {"llm", "studies"},
    "llm": {"sim", "studies"},
    "proofs_check": {"llm", "studies"},
    # the tabular studies never load the language-model world (nor, through it, torch)
    "studies.tabular": {"llm", "studies.llm"},
}
LINE_LIMIT = 3_000
"""The most lines of a package's own modules (its sub-packages count on their own)."""
OVER_THE_LIMIT = {"sim": 3_500}
"""Packages that are over ``LINE_LIMIT`` today, with a ceiling they must not pass: splitting
them (as ``studies`` was split out of them) is open work, not a licence to grow."""


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


def _within(module: str, package: str) -> bool:
    return module == package or module.startswith(f"{package}.")


def test_every_package_is_read():
    for package in PACKAGES:
        assert package in MODULES
        assert sum(name.startswith(f"{package}.") for name in MODULES) >= 5, package
    assert "studies.tabular.swap_sim" in MODULES and "sim.team" in GRAPH["sim.evaluate"]
    assert set(FLOORS) == set(PACKAGES)


def test_every_import_is_an_edge_wherever_it_stands():
    source = (
        "from typing import TYPE_CHECKING\n"
        "import numpy\n"
        "from . import swap_sim_settings\n"
        "from .families import FAMILIES\n"
        "from studies.tabular import swap_sim_summary\n"
        "if TYPE_CHECKING:\n"
        "    from sim.team import TabularTeam\n"
        "def f():\n"
        "    import studies.tabular.swap_sim_plot\n"
        "    from sim import TabularTeam, evaluate\n"
    )
    assert _imports("studies.tabular.probe", source) == {
        "sim",
        "sim.team",
        "sim.evaluate",
        "studies.tabular.swap_sim_settings",
        "studies.tabular.families",
        "studies.tabular.swap_sim_plot",
        "studies.tabular.swap_sim_summary",
    }
    # imported inside run()
    assert "studies.tabular.swap_sim_plot" in GRAPH["studies.tabular.swap_sim"]


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
        module: sorted(
            target
            for target in targets
            if any(_within(target, forbidden) for forbidden in LAYERS[package])
        )
        for module, targets in GRAPH.items()
        if _within(module, package)
    }
    assert {module: targets for module, targets in offenders.items() if targets} == {}


@pytest.mark.parametrize("package", PACKAGES)
def test_no_import_reaches_a_floor_above(package):
    above = {other for other, floor in FLOORS.items() if floor > FLOORS[package]}
    offenders = {
        module: sorted(target for target in targets if target.split(".")[0] in above)
        for module, targets in GRAPH.items()
        if _within(module, package)
    }
    assert {module: targets for module, targets in offenders.items() if targets} == {}


def _package_dirs() -> list[Path]:
    return sorted(
        init.parent
        for package in PACKAGES
        for init in (ROOT / package).rglob("__init__.py")
        if "__pycache__" not in init.parts
    )


@pytest.mark.parametrize(
    "folder", _package_dirs(), ids=lambda folder: ".".join(folder.relative_to(ROOT).parts)
)
def test_every_package_says_what_it_holds_and_stays_small(folder):
    name = ".".join(folder.relative_to(ROOT).parts)
    docstring = ast.get_docstring(ast.parse((folder / "__init__.py").read_text()))
    assert docstring and len(docstring.split()) >= 10, f"{name}/__init__.py needs a docstring"
    lines = sum(len(path.read_text().splitlines()) for path in folder.glob("*.py"))
    assert lines <= OVER_THE_LIMIT.get(name, LINE_LIMIT), (name, lines)


PATH_LOADERS = {"spec_from_file_location", "SourceFileLoader"}
"""``importlib`` names that load a file by its path; ``runpy.run_path`` is one more."""


def _loads_a_file(node: ast.AST) -> bool:
    if isinstance(node, ast.Name):
        return node.id in PATH_LOADERS
    if isinstance(node, ast.Attribute):
        return node.attr in PATH_LOADERS or node.attr == "run_path"
    if isinstance(node, ast.ImportFrom) and node.module == "runpy":
        return any(alias.name == "run_path" for alias in node.names)
    return False


def test_no_module_loads_a_file_by_its_path():
    """A package that loads a script (``figures/``) by path breaks in a non-editable install."""
    offenders = sorted(
        module
        for module, path in MODULES.items()
        if any(map(_loads_a_file, ast.walk(ast.parse(path.read_text(), str(path)))))
    )
    assert offenders == []


LLM_ROOMS = (
    "common",
    "rewards",
    "problems",
    "conversation",
    "models",
    "logprobs",
    "engines",
    "sampling",
    "evaluation",
    "update",
    "training",
    "export",
    "interface",
)
"""The rooms of ``llm`` in the order data flows through them (each room's docstring says so)."""


def test_the_language_model_backend_is_its_rooms_and_nothing_else():
    inside = [name.split(".") for name in MODULES if _within(name, "llm") and name != "llm"]
    # a room, a module in a room, or a module of a room's sub-package (llm.engines.vllm.client,
    # llm.training.stages.loop)
    assert all(2 <= len(parts) <= 4 for parts in inside)
    assert {parts[1] for parts in inside} == set(LLM_ROOMS)  # no module outside the rooms


@pytest.mark.parametrize("room", LLM_ROOMS)
def test_a_room_of_llm_imports_only_the_rooms_before_it(room):
    position = LLM_ROOMS.index(room)
    later = {f"llm.{other}" for other in LLM_ROOMS[position + 1 :]}
    offenders = {
        module: sorted(t for t in targets if any(_within(t, r) for r in later))
        for module, targets in GRAPH.items()
        if _within(module, f"llm.{room}")
    }
    assert {module: targets for module, targets in offenders.items() if targets} == {}
    docstring = ast.get_docstring(ast.parse((ROOT / "llm" / room / "__init__.py").read_text()))
    assert docstring is not None and f"Room {position + 1} of {len(LLM_ROOMS)}" in docstring
