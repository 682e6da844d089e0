"""The ``teamtr`` subcommand of the tabular world, registered in ``pyproject.toml``.

``teamtr evaluate`` is implemented here; the tabular studies (``teamtr scaling``, ``sim-train``,
``swap-sim``) live in ``studies.tabular``.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from teamtr.cli import Command

EVALUATE = Command("exact J of a built-in tabular MDP under a uniform team", "sim.commands")


def build_parser(prog: str) -> argparse.ArgumentParser:
    """Options of ``teamtr evaluate``."""
    parser = argparse.ArgumentParser(prog=prog, description=EVALUATE.help)
    parser.add_argument(
        "--mdp",
        choices=("random", "coordination", "dialogue"),
        default="random",
        help="built-in MDP family",
    )
    parser.add_argument("--agents", type=int, default=3, help="number of agents n")
    parser.add_argument("--seed", type=int, default=0, help="generator seed")
    parser.add_argument("--json", type=Path, default=None, help="also write the result here")
    return parser


def run(args: argparse.Namespace) -> int:
    """``teamtr evaluate``: build the MDP, evaluate the uniform team exactly, print J."""
    import sim

    if args.agents < 1:
        print(f"teamtr evaluate: --agents must be >= 1, got {args.agents}", file=sys.stderr)
        return 2
    if args.mdp == "random":
        mdp = sim.random_mdp(
            n_states=64, n_actions=4, n_agents=args.agents, gamma=0.9, seed=args.seed
        )
    elif args.mdp == "coordination":
        mdp = sim.coordination_game(n_agents=args.agents, seed=args.seed)
    else:
        mdp = sim.dialogue_mdp(n_agents=args.agents, seed=args.seed)
    team = sim.uniform_team(mdp)
    evaluation = sim.evaluate(mdp, team.table)
    result = {
        "mdp": args.mdp,
        "agents": args.agents,
        "seed": args.seed,
        "states": int(mdp.n_states),
        "actions": int(mdp.n_actions),
        "J": float(evaluation.J),
    }
    print(
        f"{args.mdp} MDP, {args.agents} agents, {mdp.n_states} states: J(uniform) = "
        f"{evaluation.J:.10g}"
    )
    if args.json is not None:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(result, indent=2) + "\n")
    return 0
