"""The ``teamtr`` command finds its subcommands through the packages' entry points."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from teamtr.cli import ENTRY_POINT_GROUP, Command, main, registered_commands

OWNERS = {
    "evaluate": "sim",
    "verify": "proofs_check",
    "train": "llm",
    "eval": "llm",
    "swap": "llm",
    "chat": "llm",
    "export": "llm",
    "plot": "llm",
    "scaling": "studies",
    "sim-train": "studies",
    "swap-sim": "studies",
    "gymnasium-check": "studies",
    "llm-scaling": "studies",
    "seed-study": "studies",
    "compare-report": "studies",
}


def test_every_subcommand_is_registered_by_the_package_that_owns_it():
    commands = registered_commands()
    assert set(commands) == set(OWNERS)
    for name, command in commands.items():
        assert isinstance(command, Command)
        assert command.module.split(".")[0] == OWNERS[name], name
    # Only the language-model commands parse their own command line.
    assert {n for n, c in commands.items() if c.forward_argv} == {
        "train",
        "eval",
        "swap",
        "chat",
        "export",
        "plot",
    }


def test_python_dash_m_teamtr_dispatches_without_importing_torch(tmp_path):
    out_file = tmp_path / "j.json"
    code = (
        "import runpy, sys\n"
        f"sys.argv = ['teamtr', 'evaluate', '--agents', '2', '--json', {str(out_file)!r}]\n"
        "try:\n"
        "    runpy.run_module('teamtr', run_name='__main__')\n"
        "except SystemExit as stop:\n"
        "    assert stop.code == 0, stop.code\n"
        "print('torch' in sys.modules)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.splitlines()[-1] == "False"
    assert "random MDP, 2 agents, 64 states: J(uniform) = " in out.stdout
    result = json.loads(out_file.read_text())
    assert result["agents"] == 2 and result["states"] == 64


@pytest.mark.parametrize(("argv", "code"), [([], 2), (["--help"], 0), (["no-such-command"], 2)])
def test_usage_and_unknown_commands(argv, code, capsys):
    assert main(argv) == code
    captured = capsys.readouterr()
    assert "usage: teamtr <command>" in captured.out + captured.err
    assert ENTRY_POINT_GROUP == "teamtr.commands"


def test_a_bad_evaluate_argument_exits_2_with_a_message(capsys):
    assert main(["evaluate", "--agents", "0"]) == 2
    assert "--agents must be >= 1" in capsys.readouterr().err


def test_a_stale_entry_point_breaks_only_its_own_command(monkeypatch, capsys):
    """An installed entry point whose target is gone (an older install of the package) leaves
    every other command working; running it says what is wrong in one line."""
    from importlib.metadata import EntryPoint

    import teamtr.cli as cli

    real = cli.entry_points(group=ENTRY_POINT_GROUP)
    stale = EntryPoint("gone", "llm.interface.commands:NO_SUCH_COMMAND", ENTRY_POINT_GROUP)
    monkeypatch.setattr(cli, "entry_points", lambda group: [*real, stale])
    commands = registered_commands()
    assert set(OWNERS) <= set(commands) and "unavailable" in commands["gone"].help
    assert main(["gone"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "NO_SUCH_COMMAND" in err[0] and "reinstall" in err[0]
    # The others still run.
    assert main(["evaluate", "--agents", "2"]) == 0
