"""A wheel is the whole product: built from the checkout, installed (not editable) in a fresh
virtual environment, and run from a folder outside the checkout, a tabular study draws its
figure and a shipped config is found by its name.

The fresh environment reuses this interpreter's installed dependencies through a ``.pth`` file
that lists its site-packages folders (those a ``.pth`` file of its own adds too). Folders listed in a ``.pth`` file are added to
``sys.path`` as they are: their own ``.pth`` files, among them the one that activates an
editable install of the checkout, are not run, so ``teamtr`` comes from the wheel alone (the
test asserts where every package is imported from).
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import os
import shutil
import site
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("teamtr", "sim", "llm", "proofs_check", "studies")
LEFT_OUT = {
    ".git",
    ".venv",
    "build",
    "dist",
    "runs",
    "results",
    "figures",
    "docs",
    "bench",
    "tests",
}
"""Top-level folders of the checkout the wheel does not need (copied, they only cost time)."""


def why_no_wheel() -> str | None:
    """Why ``pip wheel --no-build-isolation`` cannot build here, or None where it can."""
    if importlib.util.find_spec("pip") is None:
        return "pip is not installed in this environment"
    try:  # read from its metadata: importing setuptools here would patch distutils
        version = importlib.metadata.version("setuptools")
    except importlib.metadata.PackageNotFoundError:
        return "setuptools is not installed, so pip wheel --no-build-isolation cannot build"
    release = tuple(int(part) for part in version.split(".")[:2] if part.isdigit())
    if release < (70, 1) and importlib.util.find_spec("wheel") is None:
        return f"setuptools {version} builds wheels only with the wheel package, not installed"
    return None


pytestmark = pytest.mark.skipif(why_no_wheel() is not None, reason=str(why_no_wheel()))


def run(command: list[str | Path], cwd: Path, timeout: float = 300) -> str:
    """Run ``command`` in ``cwd`` without the checkout on the path; assert that it succeeds."""
    environment = {
        name: value
        for name, value in os.environ.items()
        if name not in ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV", "PYTHONSTARTUP")
    }
    environment["OMP_NUM_THREADS"] = "1"
    done = subprocess.run(
        [str(part) for part in command],
        cwd=cwd,
        env=environment,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    assert done.returncode == 0, f"{command}: exit {done.returncode}\n{done.stderr[-3000:]}"
    return done.stdout


def copy_of_the_checkout(target: Path) -> Path:
    """The checkout's sources, copied: a build in the checkout itself would leave build/ there,
    whose stale files (of modules since moved) setuptools would put in the next wheel."""

    def ignored(folder: str, names: list[str]) -> set[str]:
        skipped = {n for n in names if n == "__pycache__" or n.endswith((".egg-info", "_cache"))}
        if Path(folder) == ROOT:  # .venv-vllm and .venv-peers too: gigabytes each
            skipped |= {n for n in names if n in LEFT_OUT or n.startswith(".venv")}
        return skipped

    shutil.copytree(ROOT, target, symlinks=True, ignore=ignored)
    return target


@pytest.fixture(scope="module")
def installed(tmp_path_factory) -> Path:
    """The ``bin`` folder of a fresh virtual environment with the wheel installed in it."""
    where = tmp_path_factory.mktemp("wheel")
    source = copy_of_the_checkout(where / "source")
    wheels = where / "wheels"
    pip = [sys.executable, "-m", "pip", "--disable-pip-version-check"]
    run([*pip, "wheel", "--no-deps", "--no-build-isolation", "-w", wheels, source], where)
    (wheel,) = wheels.glob("teamtr-*.whl")

    venv = where / "venv"
    run([sys.executable, "-m", "venv", "--without-pip", venv], where)
    python = venv / "bin" / "python"
    # pip runs with the new interpreter and installs into its environment; the dependencies
    # are not visible there yet, so nothing installed in this one is replaced or removed.
    run([*pip, "--python", python, "install", "--no-deps", "--no-index", wheel], where)
    purelib = Path(
        run(
            [python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"], where
        ).strip()
    )
    here = [
        path
        for path in dict.fromkeys([*site.getsitepackages(), *sys.path])
        if Path(path).name in ("site-packages", "dist-packages") and Path(path).is_dir()
    ]
    (purelib / "dependencies.pth").write_text("".join(f"{path}\n" for path in here))
    return venv / "bin"


def test_every_package_comes_from_the_wheel(installed, tmp_path):
    sources = {str(ROOT), *(str(ROOT / name) for name in PACKAGES)}
    code = (
        "import importlib, sys\n"
        f"for name in {PACKAGES!r}:\n"
        "    print(importlib.import_module(name).__file__)\n"
        "import sysconfig; print(sysconfig.get_paths()['purelib'])\n"
        # The checkout's sources are not on the path (its .venv may be: the dependencies).
        "import os; sources = " + repr(sources) + "\n"
        "print(any(p and os.path.realpath(p) in sources for p in sys.path))\n"
    )
    *files, purelib, checkout_on_path = run([installed / "python", "-c", code], tmp_path).split(
        "\n"
    )[:-1]
    assert len(files) == len(PACKAGES)
    for name, file in zip(PACKAGES, files, strict=True):
        assert Path(file).parent == Path(purelib) / name, (name, file)
    assert checkout_on_path == "False"


def test_a_study_draws_its_figure_outside_the_checkout(installed, tmp_path):
    """``teamtr swap-sim --plot`` once loaded its figure's script by its path in the checkout."""
    out = tmp_path / "out"
    command = [installed / "teamtr", "swap-sim", "--seeds", "1", "--train-stages", "1"]
    command += ["--donor-stages", "1", "--further-stages", "1", "--delta0-sweep", "0.05"]
    run([*command, "--json", out / "swap.json", "--plot", out / "swap.png"], tmp_path, 120)
    assert (out / "swap.json").stat().st_size > 0
    assert (out / "swap.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_a_shipped_config_is_found_by_its_name(installed, tmp_path):
    for name in ("default", "chain/chain4_teamtr.toml"):
        run([installed / "teamtr", "train", "--config", name, "--check"], tmp_path)
    assert list(tmp_path.iterdir()) == []  # a check writes nothing
