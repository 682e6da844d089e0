"""What a team that never reads the game could win: every fixed sequence of moves played on a
TextArena game's held-out seeds (docs/environments.md, FrozenLake).

A trained team whose held-out wins equal a fixed sequence's has learned that sequence from the
game's rewards, not a policy that reads the game's text; the best fixed sequence is the most
such a team can win, and the share of games some sequence wins is what reading the game can
add. Each game is played through the adapter the runs use (``llm.problems.textarena_games``),
one move a turn, the agents taking turns as in a run.

    python -m studies.llm.environments.fixed_walks --game FrozenLake-v0 --moves down right --length 6 \\
        --first-seed 1234 --games 50 --json results/environments/frozen_lake_fixed_walks.json
"""

from __future__ import annotations

import argparse
import itertools
import json
from collections.abc import Sequence
from pathlib import Path

from llm.problems.textarena_games import WIN_REWARD, TextArenaGame, game_problems


def won(game: str, seed: int, moves: Sequence[str], n_agents: int = 2) -> bool:
    """Whether ``moves``, one a turn in the team's order, win the game of ``seed``."""
    environment = TextArenaGame(game, n_agents=n_agents)
    environment.reset(game_problems(game, [seed])[0], seed)
    for turn, move in enumerate(moves):
        reply = environment.step(turn % n_agents, f"[{move}]")
        if reply.done:
            return reply.reward >= WIN_REWARD
    return False


def fixed_walks(game: str, moves: Sequence[str], length: int, seeds: Sequence[int]) -> dict:
    """Every sequence of ``length`` moves from ``moves``: the seeds it wins; the best sequence,
    and the seeds that at least one sequence wins."""
    wins = {
        walk: [seed for seed in seeds if won(game, seed, walk)]
        for walk in itertools.product(moves, repeat=length)
    }
    ranked = sorted(wins, key=lambda walk: (-len(wins[walk]), walk))
    any_walk = sorted({seed for won_seeds in wins.values() for seed in won_seeds})
    return {
        "game": game,
        "seeds": list(seeds),
        "walks": [{"moves": list(walk), "wins": len(wins[walk])} for walk in ranked],
        "best": {"moves": list(ranked[0]), "wins": len(wins[ranked[0]])},
        "won_by_some_walk": len(any_walk),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--game", required=True, help="a TextArena registry id")
    parser.add_argument(
        "--moves", nargs="+", required=True, help="the moves, as the game reads them in [ ]"
    )
    parser.add_argument("--length", type=int, required=True, help="moves a sequence")
    parser.add_argument(
        "--first-seed", type=int, default=1234, help="the first held-out game ([task] eval_seed)"
    )
    parser.add_argument("--games", type=int, default=50, help="held-out games ([task] eval_size)")
    parser.add_argument("--json", type=Path, help="every sequence's wins as JSON")
    args = parser.parse_args(argv)
    seeds = list(range(args.first_seed, args.first_seed + args.games))
    result = fixed_walks(args.game, args.moves, args.length, seeds)
    for walk in result["walks"][:5]:
        print(f"{' '.join(walk['moves'])}: {walk['wins']} of {args.games} won")
    print(f"won by some sequence: {result['won_by_some_walk']} of {args.games}")
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(result, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
