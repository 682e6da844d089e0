"""The language-model numbers of docs/results.md (and of the README's summary of it) are those
of the committed results files.

Each number is recomputed from the per-run files under ``results/`` by the code that wrote the
tables (``studies.llm.seed_study.aggregate``, ``markdown`` and ``eval_only_accuracy``,
``studies.llm.run_records.held_out_curve``), rounded as docs/results.md rounds it, and looked up
there: a rerun whose results are committed without its table (or a table edited by hand) fails
here. Every number of the README's table of headline results is one of docs/results.md.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from studies.llm.checkpoint_curves import summarise
from studies.llm.run_records import held_out_curve
from studies.llm.seed_study import aggregate, eval_only_accuracy, markdown, sampling_markdown

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "results"
README = (ROOT / "README.md").read_text()
RESULTS_PAGE = (ROOT / "docs" / "results.md").read_text()
"""docs/results.md: the headline results, with their commands and tables."""

STUDIES = (
    "default",
    "default_narrow",
    "study_notes",
    "study_notes_g4",
    "study_arith",
    "sum3",
    "sum3_both",
    "study_arith_both",
    "study_arith_dynamic",
    "study_arith_format",
    "study_arith_grpo_dynamic",
    "precision",
    "precision_sum",
    "precision_six",
    "precision_chain",
    "engine",
)
"""Seed studies whose summary (``results/<name>.json``) and per-run files docs/results.md cites."""


def methods_of(study: str) -> list[str]:
    """The methods in the committed summary, in its order (the order of the tables' rows)."""
    return list(json.loads((RESULTS / f"{study}.json").read_text())["methods"])


def recomputed(study: str) -> dict:
    return aggregate(methods_of(study), RESULTS / study)


def table_rows(text: str) -> list[str]:
    """A page's markdown table rows, whitespace-normalised."""
    return [" ".join(line.split()) for line in text.splitlines() if line.lstrip().startswith("|")]


def assert_rows_on_pages(rows: list[str], *pages: str) -> None:
    """Every table row is on every page (a page's text, or a file name under docs/)."""
    for page in pages:
        text = page if "\n" in page else (ROOT / "docs" / page).read_text()
        present = table_rows(text)
        assert all(row in present for row in rows), (
            page[:40],
            [r for r in rows if r not in present],
        )


def runs_of(study: str, method: str) -> list[dict]:
    paths = sorted((RESULTS / study).glob(f"{method}-s*.json"), key=lambda p: p.name)
    return [json.loads(p.read_text()) for p in paths]


def percent(value: float, digits: int = 0) -> str:
    return f"{100 * value:.{digits}f}"


@pytest.mark.parametrize("study", STUDIES)
def test_the_committed_summary_is_the_aggregate_of_the_per_run_files(study):
    """``results/<study>.json`` is what ``aggregate`` makes of ``results/<study>/`` now."""
    committed = json.loads((RESULTS / f"{study}.json").read_text())
    summary = recomputed(study)
    assert summary["methods"].keys() == committed["methods"].keys()
    for method, entry in summary["methods"].items():
        assert entry["seeds"], (study, method)  # every method has runs to recompute from
        # Same files, same float64 arithmetic in the same order: equal up to the last bit,
        # written by json (repr round-trips) and read back.
        assert entry == committed["methods"][method], (study, method)


@pytest.mark.parametrize("study", ["study_notes", "study_notes_g4", "study_arith"])
def test_the_results_page_prints_each_studys_table_rows(study):
    """Every row of ``seed_study --markdown`` on the committed files is a row of docs/results.md."""
    rows = table_rows(markdown(recomputed(study)))
    assert len(rows) == 2 + len(methods_of(study)) and len(methods_of(study)) >= 3
    page_rows = table_rows(RESULTS_PAGE)
    for row in rows:
        assert row in page_rows, (study, row)
    # ...as one table: header, rule and the methods' rows in order, nothing between them
    start = page_rows.index(rows[2])
    assert page_rows[start - 2 : start + len(rows) - 2] == rows, study


@pytest.mark.parametrize(
    "study",
    [
        "default",
        "default_narrow",
        "sum3",
        "sum3_both",
        "study_arith_both",
        "study_arith_dynamic",
        "study_arith_format",
        "study_arith_grpo_dynamic",
    ],
)
def test_the_sampling_tables_are_the_committed_runs(study):
    """What sampling cost and found (``sampling_markdown``) and the accuracy table as
    docs/teams_that_learn.md prints them; docs/results.md prints the accuracy tables of the sum
    and the arithmetic studies, and the sum's sampling table."""
    summary = recomputed(study)
    docs = table_rows((ROOT / "docs" / "teams_that_learn.md").read_text())
    page = table_rows(RESULTS_PAGE)
    sampling, accuracy = table_rows(sampling_markdown(summary)), table_rows(markdown(summary))
    for row in sampling + accuracy:
        assert row in docs, (study, row)
    on_the_page = {
        "default": [],
        "default_narrow": [],
        "sum3": sampling + accuracy,
        "sum3_both": [],
    }
    for row in on_the_page.get(study, accuracy):
        assert row in page, (study, row)


def test_the_default_runs_headline_is_its_accuracy():
    """ "**0% → 99.7% ± 0.3** (mean ± s.e. over 3 seeds ...)" in docs/results.md: untrained
    greedy accuracy, then the trained mean and its standard error over the seeds, in percent;
    the README's table of headline results states the same."""
    entry = recomputed("default")["methods"]["teamtr"]
    trained = entry["trained_accuracy"]
    headline = (
        f"**{percent(entry['untrained_accuracy'])}% → {percent(trained['mean'], 1)}% ± "
        f"{percent(trained['standard_error'], 1)}** (mean ± s.e. over {len(entry['seeds'])} seeds"
    )
    assert headline in " ".join(RESULTS_PAGE.split()), headline
    summary = headline.removesuffix(f" (mean ± s.e. over {len(entry['seeds'])} seeds")
    assert f"| {summary.replace('**', '')} |" in " ".join(README.split()), summary


def test_the_per_seed_table_is_each_default_runs_curve():
    """The default run's table: per seed, untrained accuracy, greedy held-out accuracy after
    every evaluated stage, and the trained team's accuracy on the eval-only template."""
    runs = runs_of("default", "teamtr")
    assert runs
    header = next(row for row in table_rows(RESULTS_PAGE) if row.startswith("| seed | untrained |"))
    evaluated = [stage for stage, _ in held_out_curve(runs[0])]
    # the header names the stages evaluated: "2 stages | 4 | 6 | 8 | 10 stages"
    named = [int(n) for n in re.findall(r"\| (\d+)(?: stages)?(?= \|)", header)]
    assert named == evaluated, header
    page_rows = table_rows(RESULTS_PAGE)
    for run in runs:
        curve = held_out_curve(run)
        assert [stage for stage, _ in curve] == evaluated
        held_out = eval_only_accuracy(run["trained"])
        assert held_out is not None
        cells = [percent(run["untrained"]["accuracy"])]
        cells += [percent(accuracy) for _, accuracy in curve]
        cells.append(percent(held_out))
        row = f"| {run['seed']} | " + " | ".join(f"{c}%" for c in cells) + " |"
        assert row in page_rows, row
        # the last evaluated stage is the trained team the headline averages
        assert curve[-1][1] == run["trained"]["accuracy"]


def test_the_arithmetic_paragraph_states_grpos_seeds_and_the_gap():
    """ "one-turn GRPO gains 5.7 ± 4.1 points** (3, 17 and 9% on its three seeds)" and "missed
    by 0.4 points (teamtr 4.3%, GRPO 9.7%; the gap is 1.3 combined standard errors)"."""
    summary = recomputed("study_arith")["methods"]
    text = " ".join(RESULTS_PAGE.split())
    gain = summary["grpo"]["gain"]
    seeds = [percent(run["trained"]["accuracy"]) for run in runs_of("study_arith", "grpo")]
    stated = f"gains {percent(gain['mean'], 1)} ± {percent(gain['standard_error'], 1)} points** ("
    stated += ", ".join(seeds[:-1]) + f" and {seeds[-1]}% on its three seeds)"
    assert stated in text, stated
    teamtr, grpo = summary["teamtr"]["trained_accuracy"], summary["grpo"]["trained_accuracy"]
    gap = grpo["mean"] - teamtr["mean"]
    combined = (teamtr["standard_error"] ** 2 + grpo["standard_error"] ** 2) ** 0.5
    goal = 0.05  # "teamtr within 5 points of GRPO"
    stated = (
        f"missed by {percent(gap - goal, 1)} points (teamtr {percent(teamtr['mean'], 1)}%, "
        f"GRPO {percent(grpo['mean'], 1)}%; the gap is {gap / combined:.1f} combined standard errors)"
    )
    assert stated in text, stated


def test_the_private_notes_paragraph_states_the_g4_gap():
    """ "At 22 agent updates stale still leads TeamTR, by 2.0 points (2.0 combined standard
    errors)" and the shared adapter's "(92.0% ± 0.6)"."""
    summary = recomputed("study_notes_g4")["methods"]
    text = " ".join(RESULTS_PAGE.split())
    updates = summary["teamtr"]["agent_updates"]["mean"]
    teamtr, stale = summary["teamtr"]["trained_accuracy"], summary["stale"]["trained_accuracy"]
    gap = stale["mean"] - teamtr["mean"]
    combined = (teamtr["standard_error"] ** 2 + stale["standard_error"] ** 2) ** 0.5
    stated = (
        f"At {updates:.0f} agent updates stale still leads TeamTR, by {percent(gap, 1)} points "
        f"({gap / combined:.1f} combined standard errors)"
    )
    assert stated in text, stated
    shared = summary["shared"]["trained_accuracy"]
    stated = f"({percent(shared['mean'], 1)}% ± {percent(shared['standard_error'], 1)})"
    assert stated in text, stated


def test_the_chain_training_table_is_the_committed_checkpoint_curves_summary():
    """The n = 4 chain table (docs/results.md and docs/llm_scaling.md) is ``checkpoint_curves``'s
    Markdown of ``results/chain4_curves.json``, whose final numbers are those of the per-run
    curve files (the cost columns came from the run directories, which are not committed)."""
    from studies.llm.checkpoint_curves import markdown, summarise

    summary = json.loads((RESULTS / "chain4_curves.json").read_text())
    curves = [json.loads(p.read_text()) for p in sorted((RESULTS / "chain4_curves").glob("*.json"))]
    untrained = json.loads((RESULTS / "chain4" / "untrained_turn_credit.json").read_text())
    again = summarise(curves, summary["metric"], untrained)
    for method, row in again["methods"].items():
        for key in ("final", "final_accuracy", "regressions", "checkpoints", "runs"):
            assert summary["methods"][method][key] == row[key], (method, key)
    rows = table_rows(markdown(summary))
    docs = (ROOT / "docs" / "llm_scaling.md").read_text()
    for text in (RESULTS_PAGE, docs):
        present = table_rows(text)
        assert all(row in present for row in rows), [r for r in rows if r not in present]


def test_the_step_size_table_is_the_committed_map_of_the_committed_runs():
    """docs/step_size.md and docs/results.md print ``studies.llm.step_size_map``'s table of
    ``results/stepsize_map.json``, which is what the per-run curves and stage records give."""
    from studies.llm.step_size_map import markdown, run_record, summarise

    untrained = json.loads((RESULTS / "stepsize" / "untrained_teamtr-d1.json").read_text())
    runs = []
    for path in sorted((RESULTS / "stepsize_curves").glob("*.json")):
        curve = json.loads(path.read_text())
        lines = (RESULTS / "stepsize_metrics" / f"{curve['run']}.jsonl").read_text().splitlines()
        runs.append(run_record(curve, [json.loads(line) for line in lines], untrained))
    again = summarise(runs)
    committed = json.loads((RESULTS / "stepsize_map.json").read_text())
    assert json.loads(json.dumps(again)) == committed
    assert_rows_on_pages(table_rows(markdown(committed)), RESULTS_PAGE, "step_size.md")


def recomputed_map(folder: str, untrained: str, at_minutes: float) -> dict:
    """``studies.llm.step_size_map`` of the curves under ``results/<folder>_curves`` and the
    stage records under ``results/<folder>_metrics``, read at ``at_minutes``."""
    from studies.llm.step_size_map import run_record, summarise

    floor = json.loads((RESULTS / untrained).read_text())
    runs = []
    for path in sorted((RESULTS / f"{folder}_curves").glob("*.json")):
        curve = json.loads(path.read_text())
        lines = (RESULTS / f"{folder}_metrics" / f"{curve['run']}.jsonl").read_text().splitlines()
        runs.append(run_record(curve, [json.loads(line) for line in lines], floor, at_minutes))
    return json.loads(json.dumps(summarise(runs)))


def test_the_team_size_tables_are_the_committed_maps_of_the_committed_runs():
    """docs/eight_agents.md and docs/results.md print ``studies.llm.team_size``'s tables of
    ``results/team_size.json``: the maps at n = 2 (8 CPU-minutes) and n = 8 (64) recomputed from
    their runs' curves and stage records, and the step-size map's n = 4, read at δ = 0.2."""
    from studies.llm.team_size import markdown, team_size

    maps = {
        2: recomputed_map("two", "two/untrained_teamtr-d02.json", 8.0),
        4: json.loads((RESULTS / "stepsize_map.json").read_text()),
        8: recomputed_map("eight", "eight/untrained_teamtr-d02.json", 64.0),
    }
    for n, name in ((2, "two_map.json"), (8, "eight_map.json")):
        assert maps[n] == json.loads((RESULTS / name).read_text()), n
    committed = json.loads((RESULTS / "team_size.json").read_text())
    assert json.loads(json.dumps(team_size(maps, 0.2))) == committed
    assert {row["n"] for row in committed["rows"]} == {2, 4, 8}
    assert_rows_on_pages(table_rows(markdown(committed)), RESULTS_PAGE, "eight_agents.md")


def test_the_eight_agent_drift_and_weight_tables_are_the_committed_results():
    """docs/eight_agents.md prints the drift study at δ = 0.2 per turn for n = 2, 4, 8
    (``teamtr llm-scaling --markdown`` of its committed summary) and HAPPO's effective sample
    size per update position at n = 8 (``studies.llm.weight_collapse`` of the committed stage
    records of its run)."""
    from studies.llm.drift.scaling import markdown as drift_markdown
    from studies.llm.weight_collapse import collapse, read_stages
    from studies.llm.weight_collapse import markdown as weight_markdown

    drift = json.loads((RESULTS / "llm_scaling_turn_r0.2.json").read_text())
    assert drift["agents"] == [2, 4, 8]
    assert_rows_on_pages(table_rows(drift_markdown(drift)), "eight_agents.md")
    committed = json.loads((RESULTS / "eight" / "happo_weights.json").read_text())
    stages = []
    for run in committed["runs"]:
        stages += read_stages(RESULTS / "eight_metrics" / f"{run}.jsonl")
    assert committed["stages"] == len(stages) and committed["by_position"] == collapse(stages)
    assert len(committed["by_position"]) == 8
    assert_rows_on_pages(table_rows(weight_markdown(committed)), "eight_agents.md")


def test_the_sum_probe_table_is_the_committed_probe():
    """The role-by-role probe of the 3-agent sum (docs/teams_that_learn.md and docs/results.md) is
    ``studies.llm.sum_probe.markdown`` of ``results/sum3_probe.json``."""
    from studies.llm.sum_probe import markdown as probe_markdown

    result = json.loads((RESULTS / "sum3_probe.json").read_text())
    assert "untrained" in result["teams"] and len(result["teams"]) >= 2
    rows = table_rows(probe_markdown(result))
    docs = table_rows((ROOT / "docs" / "teams_that_learn.md").read_text())
    for text in (docs, table_rows(RESULTS_PAGE)):
        assert all(row in text for row in rows), [r for r in rows if r not in text]


def test_the_results_page_states_the_arithmetic_gap_with_dynamic_sampling():
    """ "Dynamic sampling alone ends at 7.0% ± 2.1, within 3 points of one-turn GRPO's 9.7 ± 4.1
    (goal met by the means; the gap, 2.7 points, is 0.6 combined standard errors, and the gain
    over plain TeamTR's 4.3 ± 0.9 is 1.2 of them)": from the arithmetic study and its dynamic-sampling
    runs."""
    dynamic = recomputed("study_arith_dynamic")["methods"]["dynamic"]["trained_accuracy"]
    plain = recomputed("study_arith")["methods"]
    grpo, teamtr = plain["grpo"]["trained_accuracy"], plain["teamtr"]["trained_accuracy"]

    def combined(a: dict, b: dict) -> float:
        return (a["standard_error"] ** 2 + b["standard_error"] ** 2) ** 0.5

    gap = grpo["mean"] - dynamic["mean"]
    gain = dynamic["mean"] - teamtr["mean"]
    within = "within" if gap <= 0.03 else "not within"
    stated = (
        f"Dynamic sampling alone ends at {percent(dynamic['mean'], 1)}% ± "
        f"{percent(dynamic['standard_error'], 1)}, {within} 3 points of one-turn GRPO's "
        f"{percent(grpo['mean'], 1)} ± {percent(grpo['standard_error'], 1)} (goal met by the "
        f"means; the gap, {percent(gap, 1)} points, is {gap / combined(grpo, dynamic):.1f} combined "
        f"standard errors, and the gain over plain TeamTR's {percent(teamtr['mean'], 1)} ± "
        f"{percent(teamtr['standard_error'], 1)} is {gain / combined(dynamic, teamtr):.1f} of them)"
    )
    assert stated in " ".join(RESULTS_PAGE.replace("**", "").split()), stated


def test_every_number_of_the_readmes_headline_table_is_a_number_of_the_results_page():
    """The README summarises docs/results.md in one table: each number in its "number" column
    (2.6, 98.7, 0.254, ...) is printed on the results page, which has the command behind it."""
    lines = README[README.index("## Headline results") :].splitlines()
    rows = [row for row in table_rows("\n".join(lines)) if row.count("|") == 4][2:]
    assert len(rows) >= 10, rows
    page = set(re.findall(r"\d+(?:\.\d+)?", RESULTS_PAGE))
    for row in rows:
        number = row.split("|")[2]
        for value in re.findall(r"\d+(?:\.\d+)?", number):
            assert value in page, (value, row)


def test_the_trl_comparison_is_the_committed_benchmark():
    """The GRPO step against TRL (docs/results.md, README) is ``bench/peer_grpo_step.py``'s
    committed result: each repeat's CPU and tokens, the medians and their ratio."""
    result = json.loads((RESULTS / "peer_grpo_step.json").read_text())
    for name, label in (("teamtr", "teamtr"), ("trl", "TRL `GRPOTrainer`")):
        runs = result["runs"][name]
        cells = " | ".join(f"{r['cpu_seconds']:.1f}, {r['generated_tokens']}" for r in runs)
        median = result["median_cpu_seconds"][name]
        assert f"| {label} (CPU s, tokens) | {cells} | {median:.1f} |" in RESULTS_PAGE
    ratio = f"{result['teamtr_over_trl']:.2f}×"
    assert f"teamtr's step costs {ratio} TRL's" in RESULTS_PAGE
    assert f"| {ratio} CPU (median of 2 each" in README


@pytest.mark.parametrize(
    ("summary", "label", "seeds"),
    [
        ("llm_scaling.json", "0.01 (message 0.04)", 3),
        ("llm_scaling_turn_r0.2.json", "0.2", 1),
        ("llm_scaling_message_r1.json", "0.25 (message 1.0)", 1),
        ("llm_scaling_turn_r1.0.json", "1.0", 1),
    ],
)
def test_the_step_size_drift_table_is_the_committed_drift_studies(summary, label, seeds):
    """docs/step_size.md's drift table: the n = 4 row of each study's ``--markdown`` table."""
    from studies.llm.drift.scaling import markdown as scaling_markdown

    result = json.loads((RESULTS / summary).read_text())
    (row,) = [r for r in scaling_markdown(result).splitlines() if r.startswith("| 4 |")]
    cells = [c.strip() for c in row.strip("|").split("|")]
    expected = (
        f"| {label} | {seeds} | {cells[1]} | {cells[2]} | {cells[5]} | {cells[6]} | {cells[7]} "
        f"| {cells[8]}, {cells[9]} |"
    )
    assert expected in (ROOT / "docs" / "step_size.md").read_text()
    assert len(result["seeds"]) == seeds
    # The label's radius is the study's, in the unit it was run with.
    radius, unit = result["settings"]["radius"], result["settings"]["radius_unit"]
    per_turn = radius / 4 if unit == "message" else radius
    assert label.startswith(f"{per_turn:g}")


def test_the_filler_rerun_table_is_the_committed_runs():
    """docs/results.md's rerun of the default run with the filler groups' gradient pass
    skipped: each seed's stage CPU, before (``default_pooled``) and now (``default_filler``),
    and the minutes to 90% of ``results/default_filler.json``."""
    reach = json.loads((RESULTS / "default_filler.json").read_text())["methods"]["teamtr"]
    minutes = reach["reach"]["minutes"]

    def stage_cpu(study: str, seed: int) -> str:
        path = RESULTS / study / f"teamtr-s{seed}.metrics.jsonl"
        return ", ".join(
            f"{json.loads(line)['cpu_seconds']:.0f}" for line in path.read_text().splitlines()
        )

    for seed, reached in enumerate(minutes):
        before, now = stage_cpu("default_pooled", seed), stage_cpu("default_filler", seed)
        cell = f"{reached:.1f}" if reached is not None else "not in 3 stages"
        assert f"| {seed} | {before} | {now} | {cell}" in RESULTS_PAGE


def test_the_prefix_reuse_table_is_the_committed_units():
    """docs/results.md's table of TeamTR's stage against stale's with prefix reuse under dynamic
    sampling: seed 0's unit per n in ``results/llm_scaling_pooled``, its ratios as
    ``studies.llm.drift.scaling`` computes them; and every unit's per-group ratio within the bound."""
    from studies.llm.drift.scaling import _cost_ratio

    for n in (2, 4, 8):
        unit = json.loads((RESULTS / "llm_scaling_pooled" / f"n{n}_seed0.json").read_text())
        ratio = _cost_ratio([unit])
        stale, teamtr = (unit["schemes"][s]["metrics"] for s in ("stale", "teamtr"))
        row = (
            f"| {n} | {stale['stage_generated_tokens']:,.0f}, {stale['stage_cpu_seconds']:.1f} "
            f"| {teamtr['stage_generated_tokens']:,.0f}, {teamtr['stage_cpu_seconds']:.1f} "
            f"| {ratio['tokens']:.2f}× | {ratio['groups_per_draw_stale']:g}, "
            f"{ratio['groups_per_draw_teamtr']:g} | {ratio['tokens_per_group']:.2f}× "
            f"| {ratio['prefix_reuse_bound']:g} | {ratio['cpu']:.2f}× |"
        )
        assert row in RESULTS_PAGE, row
    for path in sorted((RESULTS / "llm_scaling_pooled").glob("n*_seed*.json")):
        unit = json.loads(path.read_text())
        ratio = _cost_ratio([unit])
        assert f"{ratio['tokens_per_group']:.2f}" in README, path.name
        # Where every draw played as many groups as stale's, prefix reuse regenerates exactly
        # bound x stale's messages, each of at most message_tokens: the ratio can exceed the
        # bound only by the longest message over stale's mean message.
        if ratio["groups_per_draw_teamtr"] == ratio["groups_per_draw_stale"]:
            settings, stale = unit["settings"], unit["schemes"]["stale"]
            messages = unit["n"] * settings["group"] * stale["updates"][0]["groups_drawn"]
            mean_length = stale["metrics"]["stage_generated_tokens"] / messages
            limit = ratio["prefix_reuse_bound"] * settings["message_tokens"] / mean_length
            assert ratio["tokens_per_group"] <= limit + 1e-12, path.name


def test_the_relay_changes_table_is_the_committed_curves():
    """The default relay's changes separated (docs/results.md, docs/teams_that_learn.md):
    ``checkpoint_curves``'s summary of the committed per-run curves, recomputed, is the
    committed ``relay_changes_curves.json``, and its table is on both pages."""
    from studies.llm.checkpoint_curves import markdown as curves_markdown
    from studies.llm.checkpoint_curves import summarise as summarise_curves

    paths = [
        *(RESULTS / "relay_changes_curves").glob("*.json"),
        *(RESULTS / "default_quiet").glob("*.json"),
    ]
    curves = [json.loads(p.read_text()) for p in sorted(paths)]
    untrained = json.loads((RESULTS / "default" / "untrained_teamtr.json").read_text())
    again = summarise_curves(curves, "accuracy", untrained, None, 0.9, 4.0)
    committed = json.loads((RESULTS / "relay_changes_curves.json").read_text())
    assert json.loads(json.dumps(again)) == committed
    assert_rows_on_pages(
        table_rows(curves_markdown(committed)), RESULTS_PAGE, "teams_that_learn.md"
    )
    # The README's minutes are the runs' own: the previous default's (``teamtr``) and the wider
    # region's, which is the default now (tests/llm/test_llm_study_configs.py).
    reach = {m: committed["methods"][m]["reach"]["minutes"] for m in ("teamtr", "wide-region")}
    assert "3.9, 3.5 and 5.5 CPU-minutes" in README and reach["teamtr"][2] > 5
    assert "90% after 2.9, 2.5 and 1.0 CPU-minutes" in README and max(reach["wide-region"]) <= 5
    assert "90% after 2.9, 2.5 and 1.0 CPU-minutes" in " ".join(
        RESULTS_PAGE.replace("*", "").split()
    )
    assert [f"{m:.1f}" for m in reach["wide-region"]] == ["2.9", "2.5", "1.0"]
    assert [f"{m:.1f}" for m in reach["teamtr"]] == ["3.9", "3.5", "5.5"]


def test_the_float32_sum_precision_tables_are_the_committed_runs():
    """docs/results.md prints both tables of the bfloat16 runs with the float32 LoRA sum."""
    summary = recomputed("precision_sum")
    assert set(summary["methods"]) == {"float32", "bfloat16"}
    rows = table_rows(markdown(summary)) + table_rows(sampling_markdown(summary))
    assert_rows_on_pages(rows, RESULTS_PAGE)


def test_the_chain_table_in_bfloat16_is_the_committed_curves():
    """docs/scaling_out.md's turn credit after each stage of the 4-agent chain, per precision and
    seed, is that of the curves evaluated from the runs' checkpoints (float32's seeds 1 and 2
    are the step-size map's runs of the same config), as are the stages each ran in its budget
    and the bfloat16 turn credit at 8 CPU-minutes."""
    page = (ROOT / "docs" / "scaling_out.md").read_text()
    curves = {
        "float32, seed 0": RESULTS / "precision_chain_curves" / "teamtr-d02-f32-s0.json",
        "float32, seed 1 (step-size map)": RESULTS / "stepsize_curves" / "teamtr-d02-s1.json",
        "float32, seed 2 (step-size map)": RESULTS / "stepsize_curves" / "teamtr-d02-s2.json",
        **{
            f"bfloat16, seed {seed}": RESULTS
            / "precision_chain_curves"
            / f"teamtr-d02-bf16-s{seed}.json"
            for seed in (0, 1, 2)
        },
    }
    for name, path in curves.items():
        curve = json.loads(path.read_text())["curve"]
        credit = [f"{point['metrics']['turn_credit']:.3f}" for point in curve]
        row = f"| {name} | " + " | ".join(credit + [""] * (5 - len(credit))) + f" | {len(curve)} |"
        assert " ".join(row.split()) in table_rows(page), row
    summary = json.loads((RESULTS / "precision_chain.json").read_text())
    assert summary["methods"]["teamtr-d02-bf16"]["seeds"] == [0, 1, 2]
    bfloat16 = [json.loads(curves[f"bfloat16, seed {seed}"].read_text()) for seed in (0, 1, 2)]
    untrained = json.loads(
        (RESULTS / "precision_chain" / "untrained_teamtr-d02-f32.json").read_text()
    )
    at = summarise(bfloat16, "turn_credit", untrained, at=8.0)["methods"]["teamtr-d02-bf16"]["at"]
    stated = (
        "bfloat16 1.00, 0.40 and 0.98, "
        f"{at['mean']:.2f} ± {at['standard_error']:.2f} over the 3 seeds"
    )
    assert [f"{v:.2f}" for v in at["values"]] == ["1.00", "0.40", "0.98"]
    assert stated in " ".join(page.split())


def test_the_precision_tables_are_the_committed_runs():
    """docs/results.md's half-precision section prints both tables of the committed runs."""
    summary = recomputed("precision")
    assert set(summary["methods"]) == {"float32", "bfloat16"}
    rows = table_rows(markdown(summary)) + table_rows(sampling_markdown(summary))
    assert_rows_on_pages(rows, RESULTS_PAGE)


def test_the_diagnosis_numbers_are_the_committed_measurements():
    """The half-precision diagnosis's 6-seed figures on docs/scaling_out.md and docs/results.md
    (mean ± s.e. over the 12 first updates, the medians and ranges) are those of
    ``results/precision_diagnosis.json``'s per-update rows."""
    import statistics

    result = json.loads((RESULTS / "precision_diagnosis.json").read_text())
    assert [s["seed"] for s in result["seeds"]] == [0, 1, 2, 3, 4, 5]
    scaling = " ".join((ROOT / "docs" / "scaling_out.md").read_text().split())
    results = " ".join(RESULTS_PAGE.split())

    def rows(variant: str) -> list[tuple[dict, dict]]:
        return [
            (
                seed["variants"][variant]["agents"][agent],
                seed["variants"]["float32"]["agents"][agent],
            )
            for seed in result["seeds"]
            for agent in seed["variants"]["float32"]["agents"]
        ]

    def mean_se(values: list[float]) -> str:
        se = statistics.stdev(values) / len(values) ** 0.5
        return f"{statistics.fmean(values):.2f} ± {se:.2f}"

    stated = {}
    for variant in ("bfloat16", "bf16-round-once", "bf16-float32-sum"):
        pairs = rows(variant)
        assert len(pairs) == 12
        kept = [row["signal_kept"] for row, _ in pairs]
        reach = [row["kl"] / reference["kl"] for row, reference in pairs]
        stated[variant] = (mean_se(kept), mean_se(reach), f"{statistics.median(reach):.2f}")
        kept_range = f"{min(kept):.2f} to {max(kept):.2f}"
        assert f"| 12 | **{mean_se(kept)}** ({kept_range})" in scaling or (
            f"| 12 | {mean_se(kept)} ({kept_range})" in scaling
        ), (variant, kept_range)
        assert f"| {mean_se(reach)} | {statistics.median(reach):.2f} |" in scaling, variant
    peft, _, float32_sum = (stated[v] for v in ("bfloat16", "bf16-round-once", "bf16-float32-sum"))
    assert (
        f"keeps {peft[0]} of float32's log-prob change with PEFT's sum and {float32_sum[0]} with "
        f"the float32 sum, and reaches {peft[1]} and {float32_sum[1]} of float32's KL, medians "
        f"{peft[2]} and {float32_sum[2]})"
    ) in results
    assert f"{peft[0]} → {float32_sum[0]}" in results


@pytest.mark.parametrize(
    "measurement", ["precision_stage_amx.json", "precision_stage_amx_products.json"]
)
def test_the_amx_stage_profile_is_the_committed_measurement(measurement):
    """docs/stage_cost.md's bfloat16 stage, part by part (measured on AMX), and its ratios, as
    ``bench/precision_stage.py`` computes them from the committed measurement (before and
    after the decoder's products had a part of their own): every part's median CPU-s, every
    stage's, and the median (range) of the ratios to float32."""
    import statistics
    import sys

    sys.path.insert(0, str(ROOT))
    from bench.precision_stage import sections_table

    result = json.loads((RESULTS / measurement).read_text())
    page = (ROOT / "docs" / "stage_cost.md").read_text()
    names = list(result["rounds"][0])
    assert result["amx_bf16"] and len(result["rounds"]) == 2
    tables = {n: [sections_table(r[n]["sections"]) for r in result["rounds"]] for n in names}
    for part in tables["float32"][0]:
        cells = " | ".join(f"{statistics.median([t[part] for t in tables[n]]):.2f}" for n in names)
        assert f"| {part} | {cells} |" in page, part
    stages = " | ".join(
        f"**{statistics.median([r[n]['cpu_seconds'] for r in result['rounds']]):.1f}**"
        for n in names
    )
    assert f"| **stage** | {stages} |" in page
    for key in ("stage_cpu", "generation_speed"):
        for name in names[1:]:
            values = [r[name]["ratio_to_float32"][key] for r in result["rounds"]]
            median, spread = (
                f"{statistics.median(values):.3f}",
                f"({min(values):.3f}-{max(values):.3f})",
            )
            assert f"{median} {spread}" in page or f"**{median}** {spread}" in page, (name, key)
