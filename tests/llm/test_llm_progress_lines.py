"""The time left that a run's plain progress lines state says what it is: an estimate from the
run's pace so far, or, where a time budget ends the run first (or no pace is known yet), the
budget left, said as the budget. Read from the lines of short real runs (the smoke config's
tiny model, stderr not a terminal)."""

from __future__ import annotations

import re

from test_llm_cli import smoke_config

from llm.interface.cli import main

PACE = re.compile(r"; about (\d+(?:\.\d+)?) (s|min|h) left at the pace so far$")
BUDGET = re.compile(r"; (\d+(?:\.\d+)?) (s|min|h) of the time budget left$")
SPENT = "; the time budget is spent: the run ends with this stage"
UNIT_SECONDS = {"s": 1.0, "min": 60.0, "h": 3600.0}


def stage_lines(tmp_path, capsys, run: str = "") -> list[str]:
    """The `teamtr stage` lines of a 3-stage smoke run with ``run`` added to its [run]."""
    config = smoke_config(tmp_path)
    text = config.read_text().replace("stages = 2", "stages = 3")
    config.write_text(text.replace("[run]\n", "[run]\n" + run))
    assert main(["train", "--config", str(config), "--name", "r"]) == 0
    lines = capsys.readouterr().err.splitlines()
    return [line for line in lines if line.startswith("teamtr stage ")]


def seconds(found: re.Match[str]) -> float:
    return float(found.group(1)) * UNIT_SECONDS[found.group(2)]


def test_without_a_budget_the_time_left_is_said_as_an_estimate_from_the_pace(tmp_path, capsys):
    lines = stage_lines(tmp_path, capsys)
    said = [line for line in lines if " left" in line]
    assert said and all(PACE.search(line) for line in said), said
    # Nothing timed yet when the first stage starts; nothing left after the last.
    assert lines[0].startswith("teamtr stage 1/3: sampling") and " left" not in lines[0]
    assert "certificate" in lines[-1] and " left" not in lines[-1]
    # Each later stage's first line estimates from the stages done before it.
    starts = [line for line in lines if ": sampling " in line]
    assert len(starts) == 3 and all(PACE.search(line) for line in starts[1:])


def test_under_a_budget_the_stages_end_first_is_an_estimate_and_the_budget_said_as_one(
    tmp_path, capsys
):
    """A budget of 10 hours for a run of seconds: once a part of a stage is timed (the first
    agent's update), the stages end the run long before the budget, and the lines estimate
    from the pace; before, the only time known is the budget's, and it is said as the
    budget's."""
    lines = stage_lines(tmp_path, capsys, "time_budget_minutes = 600\n")
    said = [line for line in lines if " left" in line]
    paced = next(i for i, line in enumerate(said) if PACE.search(line))
    assert paced >= 1 and "update 1/2" in said[paced], said
    budgets = [BUDGET.search(line) for line in said[:paced]]
    assert all(found and seconds(found) == 36000.0 for found in budgets), said[:paced]
    assert all(PACE.search(line) for line in said[paced:]), said[paced:]
    estimates = [seconds(found) for line in said if (found := PACE.search(line))]
    assert max(estimates) < 36000.0  # the run's pace, not the budget


def test_a_budget_that_ends_the_run_is_said_as_the_budget(tmp_path, capsys):
    """A budget spent in the first stage: the run stops after it (the smoke config asks for
    3), and no line promises the time the remaining stages would take."""
    lines = stage_lines(tmp_path, capsys, "time_budget_minutes = 1e-6\n")
    assert all(line.startswith("teamtr stage 1/3") for line in lines), lines
    said = [line for line in lines if " left" in line or "budget is spent" in line]
    assert said and all(BUDGET.search(line) or line.endswith(SPENT) for line in said), said
    assert lines[-1].endswith(SPENT) and "certificate" in lines[-1]


def test_check_real_counts_the_groups_its_batch_keeps_and_those_drawn_for_them(tmp_path, capsys):
    """Dynamic sampling draws groups until one has differing rewards, at most 2 more: a tiny
    random model never writes a plural, so it draws 4 groups of 2 for a batch of 2 groups
    (4 dialogues). The line counts the batch's dialogues in the batch's groups, and says how
    many were drawn for them."""
    (tmp_path / "train.jsonl").write_text(
        '{"question": "Plural of cat?", "answer": "cats"}\n'
        '{"question": "Plural of box?", "answer": "boxes"}\n'
    )
    config = smoke_config(
        tmp_path,
        '[task]\nkind = "dataset"\ntrain_file = "train.jsonl"\nreward = "exact_match"\n',
    )
    text = config.read_text().replace("[task]\neval_size = 4\n", "")
    config.write_text(
        text.replace("[sampler]\n", "[sampler]\nsignal_groups = 1\nmax_draws = 2\n", 1)
    )
    assert main(["train", "--config", str(config), "--check", "--real", "--no-progress"]) == 0
    (line,) = [x for x in capsys.readouterr().out.splitlines() if x.startswith("real model:")]
    assert (
        line.startswith("real model: 4 dialogues in 2 groups of 2 (")
        and "; dynamic sampling drew 4 groups for these 2): 0 groups with differing rewards" in line
    )
