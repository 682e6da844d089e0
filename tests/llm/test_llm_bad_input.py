"""Bad input gets one clear message, exit code 2, no traceback, and no run directory.

Every case goes through `teamtr train` (or `eval`) as a user would run it; the message must
name the file, the line where there is one, the field, and what is expected.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from llm_test_support import SMOKE

from llm.common.config import ConfigError, load_config
from llm.interface.cli import main
from llm.problems.tasks import TaskDataError, load_jsonl


def smoke_text(runs: Path) -> str:
    return SMOKE.read_text().replace("[run]\n", f'[run]\noutput_dir = "{runs}"\n')


def line_of(text: str, fragment: str) -> int:
    return next(n for n, line in enumerate(text.splitlines(), 1) if fragment in line)


def train_fails(tmp_path: Path, text: str, capsys) -> tuple[Path, str]:
    """Run `teamtr train` on ``text``; assert exit 2 and nothing left behind; return the error."""
    config = tmp_path / "bad.toml"
    config.write_text(text)
    assert main(["train", "--config", str(config), "--name", "r", "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and err.count("\n") == 1 and "Traceback" not in err
    runs = tmp_path / "runs"
    assert not runs.exists() or not any(runs.iterdir()), "a partial run directory was left"
    return config, err


# (id, text to replace, replacement, the fragment the message must contain)
CONFIG_CASES = [
    ("radius-zero", "radius = 0.05", "radius = 0.0", "[stage] radius: must be > 0 (δ_i"),
    ("radius-negative", "radius = 0.05", "radius = -1", "[stage] radius: must be > 0"),
    ("radius-nan", "radius = 0.05", "radius = nan", "expected a finite number, got nan"),
    ("radius-string", "radius = 0.05", 'radius = "big"', "expected a number, got 'big'"),
    ("group-size-1", "group_size = 2", "group_size = 1", "[sampler] group_size: must be >= 2"),
    ("turns-0", "turns = 2", "turns = 0", "[sampler] turns: must be >= 1"),
    ("lr-zero", "learning_rate = 1e-2", "learning_rate = 0", "learning_rate: must be > 0"),
    ("lr-negative", "learning_rate = 1e-2", "learning_rate = -1e-3", "learning_rate: must be > 0"),
    ("rank-0", "rank = 4", "rank = 0", "[lora] rank: must be >= 1"),
    ("stages-0", "stages = 2", "stages = 0", "[stage] stages: must be >= 1"),
    ("steps-float", "steps = 1", "steps = 1.5", "[updater] steps: expected an integer, got 1.5"),
    ("agents-bool", "n_agents = 2", "n_agents = true", "expected an integer, got True"),
    ("scheme-unknown", 'scheme = "teamtr"', 'scheme = "ppo"', "expected one of ['teamtr'"),
    ("unknown-key", "stages = 2", "stages = 2\nstagez = 3", "[stage] stagez: unknown key"),
    ("order-range", "n_agents = 2", "n_agents = 2\nspeaking_order = [0, 5]", "0..1, got [0, 5]"),
    ("run-name-path", "eval_every = 1", 'eval_every = 1\nname = "../x"', "plain directory name"),
    ("temperature-0", "max_new_tokens = 4", "max_new_tokens = 4\ntemperature = 0", "must be > 0"),
    ("shrink-1", "steps = 1", "steps = 1\nshrink = 1.0", "[updater] shrink: must lie in (0, 1)"),
]


@pytest.mark.parametrize(
    ("old", "new", "expected"), [c[1:] for c in CONFIG_CASES], ids=[c[0] for c in CONFIG_CASES]
)
def test_bad_config_value_names_file_line_and_key(tmp_path, capsys, old, new, expected):
    text = smoke_text(tmp_path / "runs")
    assert old in text
    text = text.replace(old, new, 1)
    config, err = train_fails(tmp_path, text, capsys)
    fragment = new.splitlines()[-1]
    assert f"{config}:{line_of(text, fragment)}: " in err
    assert expected in err


def test_malformed_toml_names_the_line(tmp_path, capsys):
    text = smoke_text(tmp_path / "runs").replace("rank = 4", "rank = = 4")
    config, err = train_fails(tmp_path, text, capsys)
    assert f"{config}: cannot parse" in err and f"line {line_of(text, 'rank = = 4')}" in err


def test_unknown_section_and_non_utf8_config(tmp_path, capsys):
    _, err = train_fails(tmp_path, smoke_text(tmp_path / "runs") + "\n[stage2]\nx = 1\n", capsys)
    assert "unknown section [stage2]" in err
    config = tmp_path / "latin1.toml"
    config.write_bytes(b'[team]\nsystem_prompt = "caf\xe9"\n')
    assert main(["train", "--config", str(config)]) == 2
    assert f"{config}: not UTF-8 text" in capsys.readouterr().err


def test_missing_config_file(tmp_path, capsys):
    assert main(["train", "--config", str(tmp_path / "none.toml")]) == 2
    assert "none.toml: no such config file" in capsys.readouterr().err


def bad_model(kind: str, directory: Path) -> str:
    """A model source that cannot be loaded, of the given kind."""
    if kind == "corrupt-gguf":
        (directory / "bad.gguf").write_bytes(b"not a gguf file")
        return str(directory / "bad.gguf")
    if kind == "corrupt-config-json":
        (directory / "model").mkdir()
        (directory / "model" / "config.json").write_text("{not json")
        return str(directory / "model")
    if kind == "empty-directory":
        (directory / "empty").mkdir()
        return str(directory / "empty")
    return str(directory / "missing.gguf")


MODEL_CASES = {
    "missing-gguf": "no such file or directory",
    "corrupt-gguf": "GGUF magic",
    "corrupt-config-json": "not a valid JSON file",
    "empty-directory": "no config.json",
}


@pytest.mark.parametrize(("kind", "expected"), MODEL_CASES.items(), ids=list(MODEL_CASES))
def test_missing_or_unreadable_model(tmp_path, capsys, kind, expected):
    models = tmp_path / "models"
    models.mkdir()
    source = bad_model(kind, models)
    text = smoke_text(tmp_path / "runs").replace('source = "tiny:128x2"', f'source = "{source}"')
    _, err = train_fails(tmp_path, text, capsys)
    assert f"model source {source!r}" in err and expected in err


# (id, file content, the fragment the message must contain after "<file>:<line>: ")
DATA_CASES = [
    ("bad-json", b'{"question": "q", "answer": "1"}\n{"question": "q",\n', "2: not valid JSON"),
    ("missing-answer", b'{"question": "q"}\n', "1: missing field 'answer'"),
    ("missing-question", b'{"answer": "1"}\n', "1: missing field 'question'"),
    ("empty-answer", b'{"question": "q", "answer": "  "}\n', "1: field 'answer' is empty"),
    (
        "gsm8k-empty-final",
        b'{"question": "q", "answer": "so ####"}\n',
        "1: field 'answer' is empty",
    ),
    ("not-an-object", b'["q", "1"]\n', "1: expected a JSON object"),
    (
        "bool-answer",
        b'{"question": "q", "answer": true}\n',
        "1: field 'answer' must be a string or number",
    ),
    (
        "nan-answer",
        b'{"question": "q", "answer": NaN}\n',
        "1: field 'answer' must be a finite number",
    ),
    (
        "list-question",
        b'{"question": ["q"], "answer": "1"}\n',
        "1: field 'question' must be a string",
    ),
    ("not-utf8", b'{"question": "caf\xe9", "answer": "1"}\n', "1: not UTF-8 text"),
    (
        "surrogate",
        b'{"question": "\\ud800", "answer": "1"}\n',
        "1: field 'question' holds an unpaired surrogate",
    ),
]


@pytest.mark.parametrize(
    ("content", "expected"), [c[1:] for c in DATA_CASES], ids=[c[0] for c in DATA_CASES]
)
def test_malformed_dataset_line_names_file_line_and_field(tmp_path, capsys, content, expected):
    data = tmp_path / "train.jsonl"
    data.write_bytes(content)
    text = smoke_text(tmp_path / "runs").replace(
        "[task]\n", f'[task]\nkind = "jsonl"\ntrain_file = "{data}"\n'
    )
    _, err = train_fails(tmp_path, text, capsys)
    assert f"{data}:{expected}" in err
    with pytest.raises(TaskDataError):
        load_jsonl(data)


def test_missing_or_empty_dataset(tmp_path, capsys):
    text = smoke_text(tmp_path / "runs").replace(
        "[task]\n", f'[task]\nkind = "jsonl"\ntrain_file = "{tmp_path / "none.jsonl"}"\n'
    )
    _, err = train_fails(tmp_path, text, capsys)
    assert "none.jsonl: no such file" in err
    (tmp_path / "empty.jsonl").write_text("\n\n")
    _, err = train_fails(tmp_path, text.replace("none.jsonl", "empty.jsonl"), capsys)
    assert "empty.jsonl: no problems in file" in err
    _, err = train_fails(
        tmp_path, text.replace(f'train_file = "{tmp_path / "none.jsonl"}"', ""), capsys
    )
    assert '[task] train_file: kind = "jsonl" needs train_file' in err


def test_bad_eval_and_resume_arguments(tmp_path, capsys):
    out = tmp_path / "o.json"
    assert main(["eval", "--config", str(SMOKE), "--json", str(out), "--samples", "0"]) == 2
    assert "--samples: must be >= 1" in capsys.readouterr().err
    assert main(["eval", "--run", str(tmp_path), "--json", str(out)]) == 2
    assert "not a run directory (no config.json)" in capsys.readouterr().err
    assert main(["train", "--resume", str(tmp_path / "nowhere")]) == 2
    assert "no such run directory" in capsys.readouterr().err
    assert not out.exists()


def test_config_json_of_a_run_directory_is_checked_too(tmp_path):
    path = tmp_path / "config.json"
    path.write_text(json.dumps({"stage": {"radius": -0.1}}))
    with pytest.raises(ConfigError, match=r"config.json: \[stage\] radius: must be > 0"):
        load_config(path)


def test_a_check_on_the_resolved_config_names_the_file(tmp_path, capsys):
    """eval_size is checked against the problems the task can draw only once the config is
    resolved; the message still names the file (and the key)."""
    from llm.interface.cli import main

    config = tmp_path / "few.toml"
    chain = Path(__file__).resolve().parents[2] / "configs" / "chain" / "chain2_teamtr.toml"
    config.write_text(f'extends = "{chain}"\n[task]\neval_size = 900\n')
    assert main(["train", "--config", str(config), "--check"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(f"error: {config}: [task] eval_size:")
