"""Where a private-notes sum team fails: each role on its own, given teammates that spoke right.

A dialogue of the sum task (``[task] kind = "private_notes"``, ``note_answer = "sum"``) earns
its reward only when every speaker before the last stated its own number and the last one
added all of them. Held-out accuracy says how often that happens, not which role stops it. For
every held-out problem of a config, this probe plays each role from a transcript in which every
earlier speaker said exactly its number (the message ``"<number>"`` and the stop token):

- ``role k`` (k < last): the share of problems on which speaker k's greedy message states its
  own number;
- ``last``: the share on which the last speaker's greedy message states the sum;
- ``last_sampled``: the same for one message sampled at the run's temperature (``samples`` of
  them per problem, averaged), the chance that one dialogue with right teammates is rewarded,
  and ``group_hit``: the share of problems on which at least one of the ``samples`` is (for
  ``samples`` = the group size, the chance that a batch group holds a reward from the last
  role alone);
- ``team``: the team as it plays, greedy (the held-out accuracy).

Usage::

    python -m studies.llm.sum_probe --config configs/study/sum3_plain.toml \\
        --run runs/sum3_both/both-s0 --json results/sum3_probe.json --markdown

probes the untrained team of ``--config`` and the final checkpoint of every ``--run`` (each
with its own config, which must describe the same team and task; the format reward may
differ). Greedy messages and the
sampled ones are seeded by the probe alone: the result does not depend on anything run before.
The JSON is written after every team, and a rerun probes only the teams it does not hold.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

PROBE_SEED = 0
"""Generation seed of every probe (a fixed seed: two probes of one team give one result)."""

BATCH = 64
"""Dialogues generated together (memory: one key/value cache row each)."""


def forced_turn(encode, chat, speaker: int, text: str):
    """Speaker ``speaker``'s message ``text``, ended by the stop token as a sampled one is."""
    from llm.conversation.dialogue import Turn

    return Turn(speaker, (*encode(text), chat.stop_id))


def probe_team(team, sampler, encode, problems: Sequence[Any], samples: int) -> dict[str, float]:
    """The role-by-role numbers of the module docstring for one team on ``problems``."""
    from llm.conversation.dialogue import Episode
    from llm.problems.rewards import grade

    chat = sampler.chat
    n = len(chat.headers)
    if any(len(p.values) != n for p in problems):
        raise ValueError(f"every problem must hold one private number per speaker ({n})")

    def start(problem, spoken: int) -> Episode:
        turns = [forced_turn(encode, chat, k, str(problem.values[k])) for k in range(spoken)]
        return Episode(problem, tuple(chat.encode_prompt(problem.question)), 0, tuple(turns))

    def said(episode, turn: int, expected: int) -> bool:
        return grade(chat.message_text(episode.turns[turn]), str(expected)).correct

    def play(episodes, temperature: float):
        done = []
        for first in range(0, len(episodes), BATCH):
            batch = episodes[first : first + BATCH]
            done.extend(sampler.play(team, batch, temperature=temperature, seed=PROBE_SEED)[0])
        return done

    result: dict[str, float] = {"problems": float(len(problems)), "samples": float(samples)}
    played = play([start(p, 0) for p in problems], 0.0)
    result["team"] = float(np.mean([said(e, n - 1, sum(e.problem.values)) for e in played]))
    for k in range(n - 1):
        episodes = played if k == 0 else play([start(p, k) for p in problems], 0.0)
        result[f"role {k}"] = float(np.mean([said(e, k, e.problem.values[k]) for e in episodes]))
    last = play([start(p, n - 1) for p in problems], 0.0)
    result["last"] = float(np.mean([said(e, n - 1, sum(e.problem.values)) for e in last]))
    repeated = [start(p, n - 1) for p in problems for _ in range(samples)]
    sampled = play(repeated, sampler.settings.temperature)
    hits = np.array([said(e, n - 1, sum(e.problem.values)) for e in sampled], dtype=float)
    result["last_sampled"] = float(hits.mean())
    result["group_hit"] = float(hits.reshape(len(problems), samples).max(axis=1).mean())
    return result


def team_name(run: Path) -> str:
    """A trained team's name in the result: its study and run (``sum3_both/both-s0``)."""
    return f"{run.parent.name}/{run.name}"


def same_team_and_task(base, other) -> bool:
    """Whether two configs describe one team and one held-out task (what the probe compares);
    the format reward aside, which changes only training rewards."""
    task = dataclasses.replace(other.task, format_reward=base.task.format_reward)
    return base.team == other.team and base.task == task and base.model == other.model


def probe(
    config_path: Path, runs: Sequence[Path], samples: int, progress: bool, out: Path | None = None
) -> dict:
    """Probe the untrained team of ``config_path`` and the final checkpoint of every run.

    With ``out``, the result is written there after every team, and the teams it already
    holds (same config and samples) are not probed again: an interrupted probe resumes."""
    from llm.common.config import load_config
    from llm.models.agents import LoraTeam
    from llm.models.loading import load_tokenizer
    from llm.training.builder import build, problem_sources
    from llm.training.checkpoint import find_policies

    config = load_config(config_path)
    if config.task.kind != "private_notes" or config.task.note_answer != "sum":
        raise SystemExit(f"{config_path}: the probe needs the private-notes sum task")
    run_configs = {run: load_config(run / "config.json") for run in runs}
    for run, run_config in run_configs.items():
        if not same_team_and_task(config, run_config):
            raise SystemExit(f"{run}: its team, model or task differ from {config_path}")
    result: dict[str, Any] = {"config": str(config_path), "samples": samples, "teams": {}}
    if out is not None and out.is_file():
        before = json.loads(out.read_text())
        if before.get("config") == result["config"] and before.get("samples") == samples:
            result["teams"] = before["teams"]
    teams = result["teams"]
    wanted = ["untrained", *(team_name(run) for run in runs)]
    if all(name in teams for name in wanted):
        return result
    problems = problem_sources(config)[1]
    parts = build(config, progress=progress)
    tokenizer = load_tokenizer(config.model.source_of(0))

    def encode(text: str) -> list[int]:
        return list(tokenizer.encode(text, add_special_tokens=False))

    def record(name: str, numbers: dict[str, Any]) -> None:
        teams[name] = numbers
        print(f"{name}: {numbers}", file=sys.stderr)
        if out is not None:
            out.parent.mkdir(parents=True, exist_ok=True)
            partial = out.with_suffix(".partial")
            partial.write_text(json.dumps(result, indent=2) + "\n")
            partial.replace(out)

    def timed(team) -> dict[str, Any]:
        started = time.process_time()
        numbers = probe_team(team, parts.sampler, encode, problems, samples)
        return {**numbers, "cpu_seconds": time.process_time() - started}

    if "untrained" not in teams:
        record("untrained", timed(parts.team))
    for run in runs:
        if team_name(run) in teams:
            continue
        found = find_policies(run, None, config.team.n_policies)
        numbers = timed(LoraTeam(parts.team.backbone, found.policies))
        record(team_name(run), {"checkpoint": found.directory.name, **numbers})
    return result


COLUMNS = ("team", "role 0", "role 1", "last", "last_sampled", "group_hit")


def markdown(result: dict) -> str:
    """One row per team: the probe's shares in percent."""
    header = "| team | " + " | ".join(f"{c} (%)" for c in COLUMNS) + " |"
    lines = [header, "|" + "---|" * (len(COLUMNS) + 1)]
    for name, numbers in result["teams"].items():
        cells = [f"{100 * numbers[c]:.0f}" if c in numbers else "–" for c in COLUMNS]
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--config", type=Path, required=True, help="the task and untrained team")
    parser.add_argument("--run", type=Path, action="append", default=[], help="a trained run")
    parser.add_argument("--samples", type=int, default=8, help="sampled last messages a problem")
    parser.add_argument("--json", type=Path, help="write the result here")
    parser.add_argument("--markdown", action="store_true", help="print a table")
    parser.add_argument("--no-progress", action="store_true")
    args = parser.parse_args(argv)
    if args.samples < 1:
        parser.error(f"--samples must be >= 1, got {args.samples}")
    for run in args.run:
        if not (run / "config.json").is_file():
            parser.error(f"--run {run}: not a run directory (no config.json)")
    result = probe(args.config, args.run, args.samples, not args.no_progress, args.json)
    if args.markdown:
        print(markdown(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
