"""A task of one's own: ``llm.Task`` (problems and a reward, one float or one per turn), the
config kinds that build one (``"dataset"``, ``"python"``), ``llm.check_task``, and what bad user
code gets: exit 2, one line naming the function, the problem and the dialogue, nothing written;
a reward that fails mid-run leaves a checkpoint that ``--resume`` continues from once fixed."""

from __future__ import annotations

import json
import math
import textwrap
from pathlib import Path

import numpy as np
import pytest

import llm
from llm.common.config import ConfigError, load_config
from llm.interface.cli import main
from llm.problems.configured import build_task
from llm.problems.task import Dialogue, FormatBonus, RewardError, Task, TaskError
from llm.problems.tasks import Problem

PROBLEMS = [Problem("Capital of France?", "Paris"), Problem("Capital of Italy?", "Rome")]
TINY = """
[model]
source = "tiny"
[lora]
rank = 4
[team]
system_prompt = "Solve."
role_prompts = []
[sampler]
prompts_per_batch = 2
group_size = 2
max_new_tokens = 4
[updater]
learning_rate = 1e-2
steps = 1
[stage]
radius = 0.05
stages = 2
[run]
eval_every = 1
checkpoint_every = 1
output_dir = "runs"
"""


def dialogue(final: str = "Paris", problem: Problem = PROBLEMS[0]) -> Dialogue:
    return Dialogue(problem, ("I think Paris.", final), (0, 1))


def exact(d: Dialogue) -> float:
    return float(d.final.strip() == d.problem.answer)


# -- the Task object ---------------------------------------------------------------------------
def test_a_per_turn_reward_gives_the_mean_as_the_return_and_the_bonus_only_in_training():
    task = Task(PROBLEMS, reward=lambda d: [0.0, 1.0], bonus=FormatBonus(0.5))
    returns = task.returns(dialogue())
    assert returns.per_turn == (0.0, 1.0) and returns.value == 0.5
    # "Paris" is no number: not well formed, so the format bonus adds nothing to it ...
    assert task.training_reward(dialogue()) == 0.5
    numeric = Dialogue(Problem("2 + 3?", "5"), ("5", "5"), (0, 1))
    assert task.training_reward(numeric) == 1.0  # ... and 0.5 to a number
    # the held-out score of a problem whose answer math-verify parses is its accuracy
    assert task.score(numeric) == 1.0 and task.score(dialogue()) == 0.5


def test_a_list_of_problems_is_drawn_uniformly_with_replacement_like_a_jsonl_file():
    task = Task(PROBLEMS * 3)
    drawn = task.draw(np.random.default_rng(7), 10)
    expected = [(PROBLEMS * 3)[int(i)] for i in np.random.default_rng(7).integers(6, size=10)]
    assert drawn == expected and task.known_train == tuple(PROBLEMS * 3)


@pytest.mark.parametrize(
    ("reward", "says"),
    [
        (lambda d: None, "returned None"),
        (lambda d: "1", "returned str '1'"),
        (lambda d: math.nan, "returned nan (not finite)"),
        (lambda d: [1.0], "returned 1 per-turn rewards for 2 turns"),
        (lambda d: [1.0, None], "returned None"),
        (lambda d: {}["answer"], "raised KeyError: 'answer'"),
    ],
)
def test_a_bad_reward_value_is_one_line_naming_the_function_problem_and_dialogue(reward, says):
    with pytest.raises(RewardError) as caught:
        Task(PROBLEMS, reward=reward).returns(dialogue())
    message = str(caught.value)
    assert "\n" not in message and says in message
    assert "test_llm_own_task:" in message and "<lambda>" in message  # module:function
    assert "'Capital of France?'" in message and "agent 1: Paris" in message


def test_a_held_out_score_outside_zero_one_is_refused():
    task = Task(PROBLEMS, reward=lambda d: 3.0)
    with pytest.raises(RewardError, match=r"returned 3.0; a held-out score must lie in \[0, 1\]"):
        task.score(dialogue())


def test_a_task_refuses_what_is_not_a_problem_or_a_function():
    with pytest.raises(TaskError, match="expected llm.Problem"):
        Task([("Capital of France?", "Paris")])
    with pytest.raises(TaskError, match="reward must be a function"):
        Task(PROBLEMS, reward="exact")  # type: ignore[arg-type]
    with pytest.raises(TaskError, match="no training problems"):
        Task([])


# -- check_task --------------------------------------------------------------------------------
def test_check_task_plays_dialogues_and_reports_the_reward_kind():
    report = llm.check_task(llm.Task(PROBLEMS, [Problem("Capital of Spain?", "Madrid")], exact))
    assert report.dialogues == 8 and report.test_problems == 1 and not report.per_turn
    assert report.reward_range == (0.0, 0.0)  # a random model names no capital
    assert "1 held out" in report.lines()[0]
    # a list of problems says how many it holds, beside the draws the split check made
    assert report.train_problems == len(PROBLEMS)
    assert f"{len(PROBLEMS)} training problems (200 draws checked)" in report.lines()[0]
    drawn = llm.check_task(llm.Task(lambda rng, count: [PROBLEMS[0]] * count, reward=exact))
    assert drawn.train_problems is None and "200 training problems drawn" in drawn.lines()[0]


def test_check_task_catches_a_reward_that_is_not_deterministic():
    calls = iter(range(10**6))
    with pytest.raises(RewardError, match="not deterministic"):
        llm.check_task(Task(PROBLEMS, reward=lambda d: float(next(calls))))


def test_check_task_catches_a_reward_of_two_kinds_even_when_only_a_middle_dialogue_differs():
    """One reward per turn for the second dialogue scored, one float for every other: the
    first and the last dialogues agree, so only a check of every dialogue's kind catches it."""
    seen: list[tuple[str, ...]] = []
    called: list[int] = []  # which dialogue (in the order first seen) each call scored

    def mixed(d: Dialogue) -> float | list[float]:
        if d.messages not in seen:  # the same dialogue always gets the same kind
            seen.append(d.messages)
        called.append(seen.index(d.messages))
        return [0.0] * len(d.messages) if called[-1] == 1 else 0.0

    with pytest.raises(RewardError) as caught:
        llm.check_task(Task(PROBLEMS, [Problem("Capital of Spain?", "Madrid")], mixed))
    assert "returned one float for some dialogues and one per turn for others" in str(caught.value)
    assert 1 in called and called[-1] != 1  # the last dialogue scored got one float too


def test_check_task_catches_a_draw_that_ignores_its_generator_and_a_broken_split():
    fresh = np.random.default_rng()

    def unseeded(rng, count):
        return [Problem(f"Say {int(fresh.integers(10**9))}.", "1") for _ in range(count)]

    with pytest.raises(TaskError, match="same seed gave other problems"):
        llm.check_task(Task(unseeded))
    leaky = Task(PROBLEMS, PROBLEMS[:1], split=lambda identity: "train")
    with pytest.raises(TaskError, match="declares a split, but 1 of its drawn"):
        llm.check_task(leaky)
    assert any("also test problems" in w for w in llm.check_task(Task(PROBLEMS, PROBLEMS)).warnings)


# -- from a config file ------------------------------------------------------------------------
def write_rows(folder: Path) -> None:
    rows = [
        {"q": "Capital of France?", "a": "Paris", "level": 1},
        {"q": "Capital of Italy?", "a": "Rome", "level": 2},
    ]
    (folder / "rows.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (folder / "rows.json").write_text(json.dumps(rows))
    (folder / "rows.csv").write_text(
        "q,a,level\n" + "".join(f"{r['q']},{r['a']},{r['level']}\n" for r in rows)
    )
    import pyarrow as pa
    import pyarrow.parquet as pq

    pq.write_table(pa.Table.from_pylist(rows), folder / "rows.parquet")


@pytest.mark.parametrize("suffix", ["jsonl", "json", "csv", "parquet"])
def test_a_dataset_in_any_format_gives_the_same_problems_with_the_other_columns_as_metadata(
    tmp_path, suffix
):
    write_rows(tmp_path)
    (tmp_path / "rewards.py").write_text(
        "def exact(d):\n    return float(d.final == d.problem.answer)\n"
    )
    config = tmp_path / "c.toml"
    config.write_text(
        f'[task]\nkind = "dataset"\ntrain_file = "rows.{suffix}"\nquestion_column = "q"\n'
        'answer_column = "a"\nreward = "rewards:exact"\n'
    )
    task = build_task(load_config(config).task)
    assert task.known_train == (
        Problem("Capital of France?", "Paris", metadata={"level": 1}),
        Problem("Capital of Italy?", "Rome", metadata={"level": 2}),
    )
    assert [p.metadata for p in task.known_train] == [{"level": 1}, {"level": 2}]
    assert task.reward.__module__ == "rewards"


def test_a_config_found_through_extends_looks_for_the_task_next_to_the_file_that_names_it(
    tmp_path,
):
    example = tmp_path / "example"
    example.mkdir()
    write_rows(example)
    (example / "team.toml").write_text(
        '[task]\nkind = "dataset"\ntrain_file = "rows.csv"\nquestion_column = "q"\n'
        'answer_column = "a"\nreward = "scoring:exact"\n'
    )
    (example / "scoring.py").write_text("def exact(d):\n    return 1.0\n")
    (tmp_path / "tiny.toml").write_text('extends = "example/team.toml"\n[stage]\nstages = 1\n')
    config = load_config(tmp_path / "tiny.toml")
    assert config.task.directory == str(example)
    assert len(build_task(config.task).known_train) == 2


def test_a_directory_named_in_an_extended_file_is_relative_to_that_file(tmp_path):
    code = tmp_path / "shared" / "code"
    code.mkdir(parents=True)
    write_rows(code)
    (tmp_path / "shared" / "base.toml").write_text(
        '[task]\nkind = "dataset"\ndirectory = "code"\ntrain_file = "rows.csv"\n'
        'question_column = "q"\nanswer_column = "a"\nreward = "scoring:exact"\n'
    )
    (code / "scoring.py").write_text("def exact(d):\n    return 1.0\n")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / "tiny.toml").write_text('extends = "../shared/base.toml"\n')
    config = load_config(elsewhere / "tiny.toml")
    assert config.task.directory == str(code)
    assert len(build_task(config.task).known_train) == 2


def run_cli(tmp_path: Path, text: str, capsys, *extra: str) -> tuple[int, str]:
    config = tmp_path / "c.toml"
    config.write_text(TINY.replace('"runs"', json.dumps(str(tmp_path / "runs"))) + text)
    code = main(["train", "--config", str(config), "--no-progress", *extra])
    return code, capsys.readouterr().err


BAD_INPUTS = [
    ("def score(d):\n    return None\n", "reward rewards:score on problem", "returned None"),
    ("def score(d):\n    return 'yes'\n", "reward rewards:score on problem", "returned str 'yes'"),
    ("def score(d):\n    return float('nan')\n", "reward rewards:score", "returned nan"),
    ("def score(d):\n    return [1.0, 0.0, 1.0]\n", "rewards:score", "3 per-turn rewards for 2"),
    ("def score(d):\n    raise ValueError('no judge')\n", "rewards:score", "raised ValueError"),
    ("import not_a_module_anywhere\n", "[task] reward", "imports 'not_a_module_anywhere'"),
    ("def other(d):\n    return 1.0\n", "[task] reward", "has no 'score'"),
]


@pytest.mark.parametrize(("code", "names", "says"), BAD_INPUTS)
def test_bad_user_code_is_exit_2_one_line_and_nothing_written(tmp_path, capsys, code, names, says):
    write_rows(tmp_path)
    (tmp_path / "rewards.py").write_text(code)
    task = (
        '[task]\nkind = "dataset"\ntrain_file = "rows.jsonl"\nquestion_column = "q"\n'
        'answer_column = "a"\nreward = "rewards:score"\n'
    )
    for extra in (("--check",), ()):
        status, err = run_cli(tmp_path, task, capsys, *extra)
        assert status == 2 and len(err.strip().splitlines()) == 1, err
        assert names in err and says in err
        assert "Traceback" not in err
        if "on problem" in err:  # the problem and the dialogue's text are named
            assert "'Capital of" in err and "(dialogue: agent 0: " in err
        assert not (tmp_path / "runs").exists()


@pytest.mark.parametrize(
    ("task", "says"),
    [
        ('kind = "python"\nfactory = "nowhere:make"\n', "[task] factory: no module 'nowhere'"),
        ('kind = "python"\nfactory = "tasks:make"\n', "returned dict, expected an llm.Task"),
        (
            'kind = "dataset"\ntrain_file = "rows.jsonl"\n',
            "no column 'question' (columns: q, a, level)",
        ),
        ('kind = "dataset"\ntrain_file = "gone.jsonl"\n', "gone.jsonl: no such file"),
        ('kind = "python"\nfactory = "tasks"\n', '[task] factory: must be "module:function"'),
    ],
)
def test_a_factory_or_dataset_that_cannot_be_had_is_exit_2_naming_the_key(
    tmp_path, capsys, task, says
):
    write_rows(tmp_path)
    (tmp_path / "tasks.py").write_text("def make():\n    return {}\n")
    status, err = run_cli(tmp_path, "[task]\n" + task, capsys, "--check")
    assert status == 2 and len(err.strip().splitlines()) == 1 and says in err, err
    assert str(tmp_path / "c.toml") in err
    assert not (tmp_path / "runs").exists()


def test_a_reward_that_fails_mid_run_leaves_a_checkpoint_that_resume_continues_from(
    tmp_path, capsys
):
    """The reward breaks once the first stage is logged; fixed, the run resumes there and
    ends as the run that never broke."""
    write_rows(tmp_path)
    run_dir = tmp_path / "runs" / "r"
    broken = textwrap.dedent(
        f"""
        from pathlib import Path
        def score(d):
            metrics = Path({str(run_dir / "metrics.jsonl")!r})
            if metrics.exists() and metrics.read_text().strip():
                raise ConnectionError("the judge went away")
            return float(d.final == d.problem.answer) + 0.5 * (len(d.final) % 2)
        """
    )
    fixed = (
        "def score(d):\n    return float(d.final == d.problem.answer) + 0.5 * (len(d.final) % 2)\n"
    )
    task = (
        '[task]\nkind = "dataset"\ntrain_file = "rows.jsonl"\ntest_file = "rows.jsonl"\n'
        'question_column = "q"\nanswer_column = "a"\nreward = "rewards:score"\n'
    )
    (tmp_path / "rewards.py").write_text(broken)
    status, err = run_cli(tmp_path, task, capsys, "--name", "r")
    # One error line; before it, what the run said of its data and stages (warnings, notes).
    assert status == 2 and [line[:6] for line in err.strip().splitlines()][-1] == "error:", err
    assert sum(line.startswith("error:") for line in err.splitlines()) == 1, err
    assert "raised ConnectionError: the judge went away" in err and "stage 2" in err
    assert f"teamtr train --resume {run_dir}" in err
    assert (run_dir / "checkpoints" / "stage_1").is_dir()
    (tmp_path / "rewards.py").write_text(fixed)
    assert main(["train", "--resume", str(run_dir), "--no-progress"]) == 0
    status, _ = run_cli(tmp_path, task, capsys, "--name", "straight")
    assert status == 0

    def stages(name: str) -> list[dict]:
        lines = (tmp_path / "runs" / name / "metrics.jsonl").read_text().splitlines()
        records = [json.loads(line) for line in lines]
        for record in records:  # timings differ between any two runs
            for key in ("wall_seconds", "cpu_seconds", "sampling_seconds"):
                record.pop(key)
            record.get("eval", {}).pop("seconds", None)
        return records

    resumed, straight = stages("r"), stages("straight")
    assert len(resumed) == 2 and resumed == straight


def test_build_team_takes_a_task_with_roles_and_trains_it_through_run_stage():
    import teamtr

    task = llm.Task(
        train=PROBLEMS,
        test=PROBLEMS[:1],
        reward=lambda d: [float(len(m) % 2) for m in d.messages],
        roles=llm.Roles(role_prompts=("Propose.", "Check.", "Answer."), max_new_tokens=3),
    )
    team, sampler, updater, penalty = llm.build_team(
        task=task, source="tiny", n_agents=3, turns=3, prompts_per_batch=2, group_size=2
    )
    assert sampler.task is task and sampler.settings.max_new_tokens == 3
    report, team = teamtr.run_stage(
        team, sampler, updater, teamtr.StageConfig(radius=0.05), penalty
    )
    assert len(report.records) == 3
    first = report.sampled_rollouts[0]
    expected = [
        np.mean([len(sampler.chat.message_text(t)) % 2 for t in e.turns]) for e in first.episodes
    ]
    assert np.array_equal(first.rewards, expected)
    with pytest.raises(ConfigError, match="role_prompts"):
        llm.build_team(task=task, source="tiny", n_agents=2)
