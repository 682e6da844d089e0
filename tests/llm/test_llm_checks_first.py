"""Everything is checked before the first expensive step, and progress speaks the right way.

Where the order matters, the config names a model that does not exist: had the model been
loaded before the check, its error would have come first.
"""

from __future__ import annotations

import json
import tracemalloc
import warnings
from pathlib import Path

import pytest
from llm_test_support import SMOKE, arithmetic_sampler, make_team

import llm.common.progress
from llm.common.progress import StageProgress, library_bars
from llm.evaluation.held_out_problems import evaluate_team
from llm.interface.cli import main
from llm.models.loading import TINY_POSITIONS
from llm.problems.tasks import MAX_LINE_BYTES, Problem, TaskDataError, load_jsonl

MISSING_MODEL = 'source = "/no/such/model.gguf"'


def smoke_config(directory: Path, *replacements: tuple[str, str]) -> Path:
    text = SMOKE.read_text().replace("[run]\n", f'[run]\noutput_dir = "{directory / "runs"}"\n')
    for old, new in replacements:
        assert old in text
        text = text.replace(old, new)
    path = directory / "smoke.toml"
    path.write_text(text)
    return path


def jsonl_task(train: Path) -> tuple[str, str]:
    return ("[task]\n", f'[task]\nkind = "jsonl"\ntrain_file = "{train}"\n')


def fails(argv: list[str], capsys) -> str:
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and err.count("\n") == 1 and "Traceback" not in err, err
    return err


def test_a_run_name_with_a_path_is_refused(tmp_path, capsys):
    config = smoke_config(tmp_path)
    for name in ("../../elsewhere", "a/b", "..", "", "~x"):
        err = fails(["train", "--config", str(config), "--name", name, "--no-progress"], capsys)
        assert "--name: must be a plain directory name" in err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["smoke.toml"]


@pytest.mark.parametrize("kind", ["directory", "under-a-file"])
def test_eval_json_destination_is_checked_before_the_model_loads(tmp_path, capsys, kind):
    config = smoke_config(tmp_path, ('source = "tiny:128x2"', MISSING_MODEL))
    (tmp_path / "file").write_text("x")
    destination = tmp_path if kind == "directory" else tmp_path / "file" / "out.json"
    err = fails(["eval", "--config", str(config), "--json", str(destination)], capsys)
    assert err.startswith("error: --json: ")
    assert ("is a directory" if kind == "directory" else "is not a directory") in err


@pytest.mark.parametrize(
    ("option", "value", "message"),
    [
        ("--align-lr", "-1", "argument --align-lr: must be a finite number > 0, got '-1'"),
        ("--align-lr", "nan", "must be a finite number > 0, got 'nan'"),
        ("--align-steps", "-3", "argument --align-steps: must be >= 0, got -3"),
        ("--delta0", "0", "argument --delta0: must be a finite number > 0"),
        ("--probe-size", "0", "argument --probe-size: must be >= 1, got 0"),
        ("--probe-seed", "-1", "argument --probe-seed: must be >= 0, got -1"),
        ("--stages", "x", "argument --stages: expected an integer, got 'x'"),
    ],
)
def test_swap_numbers_have_ranges(tmp_path, capsys, option, value, message):
    argv = ["swap", "--run", str(tmp_path), "--agent", "0", "--model", str(tmp_path)]
    err = fails([*argv, "--align", f"{option}={value}"], capsys)
    assert message in err
    assert list(tmp_path.iterdir()) == []


def test_an_answer_that_does_not_parse_is_refused_at_load(tmp_path, capsys):
    data = tmp_path / "train.jsonl"
    data.write_text(
        '{"question": "2+2?", "answer": "4"}\n{"question": "fruit?", "answer": "banana"}\n'
    )
    config = smoke_config(tmp_path, ('source = "tiny:128x2"', MISSING_MODEL), jsonl_task(data))
    err = fails(["train", "--config", str(config), "--name", "r", "--no-progress"], capsys)
    assert f"{data}:2: field 'answer' 'banana' is not a number or expression" in err
    assert not (tmp_path / "runs").exists()


def test_a_10_mb_line_is_refused_without_reading_it_whole(tmp_path):
    data = tmp_path / "huge.jsonl"
    data.write_text('{"question": "' + "x" * 10 * 2**20 + '", "answer": "1"}\n')
    tracemalloc.start()
    with pytest.raises(TaskDataError, match=f"huge.jsonl:1: line longer than {MAX_LINE_BYTES}"):
        load_jsonl(data)
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    assert peak < 3 * MAX_LINE_BYTES  # the line is 10 MiB; only its first MiB was read


def test_dialogues_longer_than_the_model_are_refused_before_the_run_directory(tmp_path, capsys):
    config = smoke_config(tmp_path, ("max_new_tokens = 4", "max_new_tokens = 9000"))
    err = fails(["train", "--config", str(config), "--name", "r", "--no-progress"], capsys)
    assert (
        "[sampler] max_new_tokens: the longest dialogue needs" in err
        and f"has {TINY_POSITIONS} positions" in err
    )
    assert not (tmp_path / "runs" / "r").exists()
    data = tmp_path / "long.jsonl"
    data.write_text(json.dumps({"question": "y" * 20_000, "answer": "1"}) + "\n")
    config = smoke_config(tmp_path, jsonl_task(data))
    err = fails(["train", "--config", str(config), "--name", "r", "--no-progress"], capsys)
    assert "the longest dialogue needs" in err and "shorten the questions" in err
    out = tmp_path / "e.json"
    err = fails(
        ["eval", "--config", str(smoke_config(tmp_path)), "--data", str(data), "--json", str(out)],
        capsys,
    )
    assert err.startswith("error: --data: the longest dialogue needs") and not out.exists()


# -- progress ------------------------------------------------------------------------------------
def test_without_a_terminal_each_stage_prints_plain_lines(tmp_path, capsys):
    """One line per part of a stage (its samplings, its updates), then one that ends it."""
    config = smoke_config(tmp_path)
    assert main(["train", "--config", str(config), "--name", "r"]) == 0
    err = capsys.readouterr().err
    assert "\r" not in err
    lines = [line for line in err.splitlines() if line.startswith("teamtr stage ")]
    ends = [line for line in lines if "certificate " in line]
    assert [line.split(":")[0] for line in ends] == ["teamtr stage 1/2", "teamtr stage 2/2"]
    assert all(": reward " in line for line in ends)
    for stage in ("1/2", "2/2"):
        parts = [line for line in lines if line.startswith(f"teamtr stage {stage}: ")]
        assert sum(": sampled " in line for line in parts) == 2  # teamtr samples per update
        assert sum(" update " in line for line in parts) == 2


def test_a_budgeted_bar_counts_the_budget_and_a_plain_one_the_stages(monkeypatch, capsys):
    monkeypatch.setattr(llm.common.progress, "on_terminal", lambda: True)
    common = {"scheme": "teamtr", "start_stage": 0, "enabled": True}
    budgeted = StageProgress(stages=1000, budget_seconds=1800, elapsed_seconds=90, **common)
    assert budgeted.bar is not None and (budgeted.bar.total, budgeted.bar.n) == (1800, 90)
    budgeted.stage_done(0, elapsed_seconds=150.4, stage_seconds=60.4, reward=0.5, cert=0.0)
    assert budgeted.bar.n == 150
    budgeted.close()
    plain = StageProgress(stages=16, budget_seconds=0, elapsed_seconds=0, **common)
    assert plain.bar is not None and plain.bar.total == 16
    plain.stage_done(0, elapsed_seconds=1, stage_seconds=1, reward=0.5, cert=0.0)
    assert plain.bar.n == 1
    plain.close()
    silent = StageProgress(
        stages=16, budget_seconds=0, elapsed_seconds=0, **{**common, "enabled": False}
    )
    assert silent.bar is None
    capsys.readouterr()


def test_evaluation_progress_moves_with_every_generated_batch(char_tokenizer, capsys):
    from llm.conversation.dialogue import ChatFormat

    chat = ChatFormat.from_tokenizer(char_tokenizer, 2, system_prompt="Solve.")
    team = make_team(len(char_tokenizer), 2)
    sampler = arithmetic_sampler(chat, n_agents=2, turns=2, max_new_tokens=2)
    problems = [Problem(f"What is {k} + 1?", str(k + 1)) for k in range(3)]
    batches: list[int] = []
    sampler.play(team, [], on_messages=batches.append)
    assert batches == []
    from llm.conversation.dialogue import Episode

    episodes = [Episode(p, tuple(chat.encode_prompt(p.question)), 0) for p in problems]
    sampler.play(team, episodes, on_messages=batches.append)
    assert batches == [3, 3]  # one generated batch per turn, even for three questions
    evaluate_team(team, sampler, problems, progress=True)
    err = capsys.readouterr().err
    assert err.startswith("evaluating: 3 questions in ") and err.count("\n") == 1


def test_no_progress_silences_the_gguf_loading_bars():
    import transformers.modeling_gguf_pytorch_utils as gguf_loading
    from transformers.utils import logging as transformers_logging

    original = gguf_loading.tqdm
    assert transformers_logging.is_progress_bar_enabled()
    with library_bars(False):
        assert gguf_loading.tqdm(range(3)).disable  # "Converting and de-quantizing GGUF ..."
        assert not transformers_logging.is_progress_bar_enabled()  # "Loading weights"
    assert gguf_loading.tqdm is original and transformers_logging.is_progress_bar_enabled()
    with library_bars(True):
        assert gguf_loading.tqdm is original


def test_building_adapters_raises_no_gradient_checkpointing_warning(char_tokenizer):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        make_team(len(char_tokenizer), 2)
    assert not [w for w in caught if "gradient_checkpointing" in str(w.message)]
