"""The ``teamtr`` console script: one dispatcher, each subcommand in the package that owns it.

Subcommand modules are imported only when their subcommand runs, so ``teamtr --help`` and the
tabular commands never import torch.
"""

from __future__ import annotations

import argparse
import importlib
import json
import sys
from collections.abc import Sequence
from pathlib import Path

# name -> (module providing build_parser(prog) and run(args) -> int, one-line help)
TABULAR_COMMANDS: dict[str, tuple[str, str]] = {
    "evaluate": ("teamtr.cli", "exact J of a built-in tabular MDP under a uniform team"),
    "verify": ("proofs_check.verify", "check every lemma and theorem on seeded random instances"),
    "scaling": ("sim.experiments.scaling", "measure the n^2 (stale) vs n (teamtr) drift scaling"),
    "sim-train": ("sim.experiments.sim_train", "multi-stage tabular training of every scheme"),
    "swap-sim": ("sim.experiments.swap", "exact swap-shock study: direct versus aligned swaps"),
}
# Language-model commands live in llm/ (torch); argv is forwarded unparsed.
LLM_COMMANDS: dict[str, str] = {
    "train": "train a team of language models from a TOML config",
    "eval": "evaluate a trained (or untrained) team on a dataset",
    "swap": "replace one agent of a run by another model, optionally after Stage-0 alignment",
}


def _usage() -> str:
    lines = ["usage: teamtr <command> [options]", "", "commands:"]
    for name, (_, text) in TABULAR_COMMANDS.items():
        lines.append(f"  {name:<10} {text}")
    for name, text in LLM_COMMANDS.items():
        lines.append(f"  {name:<10} {text}")
    lines += ["", "Run `teamtr <command> --help` for the options of one command."]
    return "\n".join(lines)


def build_parser(prog: str) -> argparse.ArgumentParser:
    """Options of ``teamtr evaluate``."""
    parser = argparse.ArgumentParser(prog=prog, description=TABULAR_COMMANDS["evaluate"][1])
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


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help"):
        print(_usage())
        return 0 if argv else 2
    command, rest = argv[0], argv[1:]
    if command in LLM_COMMANDS:
        from llm.cli import main as llm_main

        return llm_main(argv)
    if command not in TABULAR_COMMANDS:
        print(f"teamtr: unknown command {command!r}\n\n{_usage()}", file=sys.stderr)
        return 2
    module = importlib.import_module(TABULAR_COMMANDS[command][0])
    args = module.build_parser(f"teamtr {command}").parse_args(rest)
    return int(module.run(args))


if __name__ == "__main__":
    raise SystemExit(main())
