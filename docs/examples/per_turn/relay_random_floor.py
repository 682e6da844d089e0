"""The random floor of the relay chain (docs/eight_agents.md), computed exactly from the task.

``docs/examples/per_turn/relay_chain.py`` pays each turn whose first number is the first
speaker's number; the held-out set asks every number of 1..note_max once. A turn's reward
depends on its own message only, so a team whose speakers answer independently scores, in
expectation, the mean over turns of each turn's mean reward over its answers. Two random teams:

- ``first_right``: the first speaker states its number, every later speaker says a uniform
  random number of 1..note_max (the step-size map's random team, docs/step_size.md);
- ``all_random``: every speaker says a uniform random number of 1..note_max.

Each turn's mean is taken over all note_max answers with the task's own reward (no sampling):
turn credit is the mean return, accuracy the last turn's mean (the last speaker states the
first number).

Usage::

    python docs/examples/per_turn/relay_random_floor.py --agents 2 4 8 \
        --json results/eight/random_floor.json
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import sys
from pathlib import Path

import numpy as np

TASK_FILE = Path(__file__).resolve().with_name("relay_chain.py")


def relay_module():
    """The relay chain's task file beside this one (an example, not a package module)."""
    spec = importlib.util.spec_from_file_location("relay_chain", TASK_FILE)
    assert spec is not None and spec.loader is not None, TASK_FILE
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def turn_means(n_agents: int, note_max: int, first_right: bool) -> np.ndarray:
    """Per held-out problem and turn, the turn's mean reward over its answers: shape
    (problems, turns)."""
    import llm

    relay = relay_module()
    task = relay.make(n_agents=n_agents, note_max=note_max)
    speakers = tuple(range(n_agents))
    means = np.zeros((len(task.test), n_agents))
    for p, problem in enumerate(task.test):
        for turn in range(n_agents):
            answers = [problem.answer] if turn == 0 and first_right else range(1, note_max + 1)
            rewards = []
            for answer in answers:
                messages = [problem.answer] * n_agents
                messages[turn] = str(answer)
                dialogue = llm.Dialogue(problem, tuple(messages), speakers)
                rewards.append(task.reward(dialogue)[turn])
            means[p, turn] = float(np.mean(rewards))
    return means


def floors(n_agents: int, note_max: int = 50) -> dict[str, dict[str, float | str]]:
    out: dict[str, dict[str, float | str]] = {}
    for name, first_right in (("first_right", True), ("all_random", False)):
        means = turn_means(n_agents, note_max, first_right)
        out[name] = {
            "turn_credit": round(float(means.mean()), 12),
            "accuracy": round(float(means[:, -1].mean()), 12),
        }
    out["first_right"]["formula"] = "(1 + (n - 1) / note_max) / n, accuracy 1 / note_max"
    out["all_random"]["formula"] = "1 / note_max, accuracy 1 / note_max"
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--agents", type=int, nargs="+", default=[8])
    parser.add_argument("--note-max", type=int, default=50)
    parser.add_argument("--json", type=Path, help="write the floors here")
    args = parser.parse_args(argv)
    record = {
        "task": "docs/examples/per_turn/relay_chain.py",
        "note_max": args.note_max,
        "held_out_problems": args.note_max,
        "exact": "every answer of 1..note_max enumerated with the task's reward, no sampling",
        "floors": {str(n): floors(n, args.note_max) for n in args.agents},
    }
    text = json.dumps(record, indent=1) + "\n"
    if args.json:
        args.json.write_text(text)
    sys.stdout.write(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
