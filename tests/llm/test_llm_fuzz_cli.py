"""Fuzzing the command line of `teamtr train`, `eval` and `swap`: no input gives a traceback.

Arguments are drawn from every option of the three commands, with numbers in and out of range
(negative, zero, huge, NaN, not numbers) and paths of every kind (a valid config, run directory,
data file or adapter, a missing path, a directory where a file belongs, a file where a directory
belongs, ``/dev/null``, an empty string, a name too long for the file system, odd characters).
Each argv runs with ``--check``, which performs every check of the command and stops before a
model would load; every input must then exit 0, or exit 2 with one ``error:`` line, and leave
the workspace as it was.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from llm_test_support import SMOKE

from llm.interface.cli import main

FUZZ = settings(
    max_examples=200,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)


@pytest.fixture(scope="module")
def workspace(tmp_path_factory) -> dict[str, str]:
    """Named paths of every kind; the valid ones are a finished tiny run and its inputs."""
    root = tmp_path_factory.mktemp("cli")
    config = root / "smoke.toml"
    config.write_text(
        SMOKE.read_text().replace("[run]\n", f'[run]\noutput_dir = "{root / "runs"}"\n')
    )
    assert main(["train", "--config", str(config), "--name", "done", "--no-progress"]) == 0
    run = root / "runs" / "done"
    data = root / "data.jsonl"
    data.write_text('{"question": "What is 2 + 3?", "answer": "5"}\n')
    garbage = root / "garbage.bin"
    garbage.write_bytes(b"\x00\xff not toml, not json, not safetensors")
    adapter = root / "agent0.safetensors"
    shutil.copy(run / "checkpoints" / "stage_2" / "agent0.safetensors", adapter)
    return {
        "config": str(config),
        "run": str(run),
        "data": str(data),
        "adapter": str(adapter),
        "garbage": str(garbage),
        "directory": str(root),
        "missing": str(root / "missing" / "x.toml"),
        "under-a-file": str(garbage / "x.json"),
        "new-file": str(root / "new" / "out.json"),
        "dev-null": "/dev/null",
        "empty": "",
        "dot-dot": "..",
        "too-long": str(root / ("n" * 300)),
        "odd": str(root / "ä b\tc;$(x)"),
        "dash": "-",
    }


numbers = st.one_of(
    st.integers(-5, 40).map(str),
    st.sampled_from(["0", "-1", "1e308", "nan", "inf", "-inf", "1.5", "0x10", "", "abc", "9" * 30]),
    st.floats(allow_nan=True, allow_infinity=True).map(repr),
)
PATH_OPTIONS = {"--config", "--resume", "--run", "--data", "--json", "--model", "--probe", "--out"}
OPTIONS = {
    "train": ["--config", "--resume", "--name", "--no-progress"],
    "eval": ["--run", "--config", "--step", "--data", "--json", "--samples", "--no-progress"],
    "swap": [
        "--run",
        "--agent",
        "--model",
        "--model-agent",
        "--step",
        "--align",
        "--delta0",
        "--probe",
        "--probe-size",
        "--probe-seed",
        "--align-steps",
        "--align-lr",
        "--stages",
        "--out",
    ],
}
FLAGS = {"--no-progress", "--align"}


@st.composite
def command_lines(draw, paths: dict[str, str]) -> list[str]:
    command = draw(st.sampled_from(sorted(OPTIONS)))
    chosen = draw(st.lists(st.sampled_from(OPTIONS[command]), max_size=7, unique=True))
    argv = [command]
    for option in chosen:
        argv.append(option)
        if option in FLAGS:
            continue
        if option in PATH_OPTIONS:
            argv.append(paths[draw(st.sampled_from(sorted(paths)))])
        elif option == "--name":
            argv.append(draw(st.sampled_from(["fresh", "done", "../x", "a/b", "", ".", "ok-1"])))
        else:
            argv.append(draw(numbers))
    return [*argv, "--check"]


def snapshot(root: Path) -> set[str]:
    return {str(p.relative_to(root)) for p in root.rglob("*")}


def test_every_command_line_checks_or_exits_2_with_one_line(workspace, capsys):
    root = Path(workspace["directory"])
    before = snapshot(root)
    codes: set[int] = set()

    @FUZZ
    @given(command_lines(workspace))
    @example(["train", "--config", workspace["config"], "--name", "fresh", "--check"])
    @example(["train", "--resume", workspace["run"], "--check"])
    @example(["eval", "--run", workspace["run"], "--json", workspace["new-file"], "--check"])
    @example(["eval", "--config", workspace["config"], "--json", workspace["directory"], "--check"])
    @example(
        ["eval", "--config", workspace["too-long"], "--json", workspace["new-file"], "--check"]
    )
    @example(
        [
            "swap",
            "--run",
            workspace["run"],
            "--agent",
            "0",
            "--model",
            workspace["adapter"],
            "--check",
        ]
    )
    @example(
        [
            "swap",
            "--run",
            workspace["run"],
            "--agent",
            "0",
            "--model",
            workspace["run"],
            "--align",
            "--align-lr",
            "-1",
            "--check",
        ]
    )
    @example(["train", "--resume", "", "--check"])  # an empty path once reached Path(None)
    def check(argv: list[str]) -> None:
        code = main(argv)
        codes.add(code)
        out, err = capsys.readouterr()
        assert "Traceback" not in out + err
        assert code in (0, 2), (argv, code, err)
        if code == 2:
            assert err.startswith("error: ") and err.count("\n") == 1, (argv, err)
        assert snapshot(root) == before, argv  # a check writes nothing

    check()
    assert codes == {0, 2}  # the draws reached both valid and invalid command lines
