"""The README's "Use your trained team" commands and the Python of docs/exported_team.md run as
printed, on a tiny run with private notes (``runs/<name>`` and ``my_team`` replaced by a trained
tiny run and a fresh folder)."""

from __future__ import annotations

import re
import shlex
import subprocess
import sys

from llm_test_support import REPO

from teamtr.cli import main


def section(text: str, heading: str) -> str:
    start = text.index(heading)
    end = text.find("\n## ", start + 1)
    return text[start : end if end > 0 else len(text)]


def test_the_readme_commands_chat_export_and_play_from_python(notes_run, tmp_path, capsys):
    """The ``teamtr`` lines through the console script's function, in this process; the
    ``python -c`` line in an interpreter of its own, as printed."""
    run = notes_run
    readme = section((REPO / "README.md").read_text(), "## Use your trained team")
    (bash,) = re.findall(r"```bash\n(.*?)```", readme, re.DOTALL)
    lines = [line.split("  #")[0] for line in bash.splitlines() if line.strip()]
    assert [line.split()[:2] for line in lines] == [
        ["teamtr", "chat"],
        ["teamtr", "export"],
        ["python", "-c"],
    ]
    outputs = []
    for line in lines:
        line = line.replace("runs/<name>", str(run)).replace("my_team", str(tmp_path / "my_team"))
        words = shlex.split(line)
        if words[0] == "teamtr":
            capsys.readouterr()
            assert main(words[1:]) == 0, (line, capsys.readouterr().err)
            outputs.append(capsys.readouterr().out)
            continue
        done = subprocess.run(
            [sys.executable, *words[1:]], capture_output=True, text=True, timeout=600, cwd=REPO
        )
        assert done.returncode == 0, (line, done.stderr)
        outputs.append(done.stdout)
    turns = [line for line in outputs[0].splitlines() if line.startswith("agent ")]
    assert [line.split(":")[0] for line in turns] == [
        "agent 0",
        "agent 1",
        "agent 0",
    ]
    assert (tmp_path / "my_team" / "agent1" / "adapter_config.json").is_file()
    assert (tmp_path / "my_team" / "base" / "model.safetensors").is_file()  # --with-base
    assert outputs[2].startswith("(")  # the dialogue's messages, a tuple of three


def test_the_python_of_the_docs_page_runs(notes_run):
    run = notes_run
    page = (REPO / "docs" / "exported_team.md").read_text()
    (code,) = re.findall(r"```py\n(.*?)```", page, re.DOTALL)
    code = code.replace("runs/<name>", str(run)) + "\nprint(len(dialogues), dialogue.speakers)\n"
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=600, cwd=REPO
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.split("\n")[-2] == "2 (0, 1, 0)"
