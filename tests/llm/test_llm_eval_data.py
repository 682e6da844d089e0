"""``teamtr eval --data`` reads a user's file as ``[task] kind = "dataset"`` does: JSON, JSONL, CSV
and Parquet, the run's own column mapping (or the command line's), notes played to their agents
(read back from the transcript), other columns in ``Problem.metadata`` for the reward; a field
the team would not see is refused in one line."""

from __future__ import annotations

import json

import datasets
import pytest
from team_out_support import ROWS

import llm
from llm.interface.cli import main


def write_rows(path, rows):
    table = datasets.Dataset.from_list(rows)
    if path.suffix == ".parquet":
        table.to_parquet(str(path))
    elif path.suffix == ".csv":
        table.to_csv(str(path), index=False)
    else:
        path.write_text("".join(json.dumps(row) + "\n" for row in rows))


def evaluated(run, data, out, *options, source="--run"):
    """``teamtr eval`` of ``run`` (a run directory, or a config with ``source="--config"``)
    on ``data``: the transcripts it wrote, one record a dialogue."""
    assert (
        main(
            [
                "eval",
                source,
                str(run),
                "--data",
                str(data),
                "--json",
                str(out),
                "--no-progress",
                *options,
            ]
        )
        == 0
    )
    transcripts = out.with_name(out.stem + ".transcripts.jsonl")
    return [json.loads(line) for line in transcripts.read_text().splitlines()]


@pytest.mark.parametrize("suffix", [".jsonl", ".csv", ".parquet"])
def test_eval_data_plays_each_rows_notes_to_its_agents(notes_run, tmp_path, suffix):
    rows = ROWS[:3]
    data = tmp_path / f"mine{suffix}"
    write_rows(data, rows)
    records = evaluated(notes_run, data, tmp_path / "e.json")
    assert [r["notes"] for r in records] == [[r["note_a"], r["note_b"]] for r in rows]
    team = llm.load_team(notes_run, device="cpu")
    for row, record in zip(rows, records, strict=True):
        played = team.play(row["question"], (row["note_a"], row["note_b"]))
        assert [t["text"] for t in record["turns"]] == list(played.messages)


def test_the_command_line_maps_columns_of_another_file(notes_run, tmp_path):
    rows = [
        {"q": r["question"], "a": r["answer"], "x": r["note_a"], "y": r["note_b"]} for r in ROWS[:2]
    ]
    data = tmp_path / "other.json"
    data.write_text(json.dumps(rows))
    mapping = [
        "--question-column",
        "q",
        "--answer-column",
        "a",
        "--notes-column",
        "x",
        "--notes-column",
        "y",
    ]
    records = evaluated(notes_run, data, tmp_path / "o.json", *mapping)
    assert [r["notes"] for r in records] == [[r["x"], r["y"]] for r in rows]
    assert [r["question"] for r in records] == [r["q"] for r in rows]


REWARD = """
def weight(dialogue):
    return float(dialogue.problem.metadata["weight"])
"""


def test_other_columns_reach_the_reward_as_metadata(tmp_path):
    (tmp_path / "meta.py").write_text(REWARD)
    train = tmp_path / "train.csv"
    write_rows(train, [{"question": "What is 1 + 1?", "answer": "2", "weight": 0.0}])
    config = tmp_path / "c.toml"
    config.write_text(
        '[model]\nsource = "tiny"\n[lora]\nrank = 4\n[team]\nrole_prompts = []\n'
        '[task]\nkind = "dataset"\ntrain_file = "train.csv"\nreward = "meta:weight"\n'
        'metric = "meta:weight"\n[sampler]\nmax_new_tokens = 3\n'
    )
    data = tmp_path / "held_out.csv"
    write_rows(
        data,
        [
            {"question": f"What is {k} + 1?", "answer": str(k + 1), "weight": k / 4}
            for k in range(3)
        ],
    )
    transcripts = evaluated(config, data, tmp_path / "e.json", source="--config")
    assert [t["score"] for t in transcripts] == [0.0, 0.25, 0.5]


def refused(argv, capsys) -> str:
    capsys.readouterr()
    assert main([*argv, "--check"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: "), err
    return err[0]


@pytest.mark.parametrize(
    ("rows", "options", "message"),
    [
        (ROWS[:1], ["--notes-column", "note_a"], "1 notes columns ['note_a'] for a team of 2"),
        (ROWS[:1], ["--question-column", "ask"], "no column 'ask'"),
    ],
    ids=["notes_of_another_size", "absent_column"],
)
def test_eval_data_refuses_bad_rows_in_one_line(
    notes_run, tmp_path, capsys, rows, options, message
):
    data = tmp_path / "bad.jsonl"
    write_rows(data, rows)
    argv = [
        "eval",
        "--run",
        str(notes_run),
        "--data",
        str(data),
        "--json",
        str(tmp_path / "x.json"),
    ]
    assert message in refused([*argv, *options], capsys)


@pytest.mark.parametrize(
    ("row", "message"),
    [
        (
            {"question": "What is 1 + 2?", "answer": "3", "notes": "a = 1"},
            "column 'notes' would reach no agent",
        ),
        ({"question": "What is 1 + 2?", "answer": "banana"}, "answer 'banana' is not a number"),
    ],
    ids=["unmapped_notes_column", "answer_math_verify_cannot_read"],
)
def test_a_run_scored_by_math_verify_without_notes_refuses(tmp_path, capsys, row, message):
    data = tmp_path / "rows.jsonl"
    write_rows(data, [row])
    config = tmp_path / "plain.toml"
    config.write_text('[model]\nsource = "tiny"\n[task]\neval_size = 2\n')
    argv = [
        "eval",
        "--config",
        str(config),
        "--data",
        str(data),
        "--json",
        str(tmp_path / "x.json"),
    ]
    assert message in refused(argv, capsys)
