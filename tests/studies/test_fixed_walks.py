"""studies.llm.environments.fixed_walks: a fixed walk wins a FrozenLake exactly when its cells, read off the
game's own grid, miss every hole and reach the goal."""

import itertools

import pytest

pytest.importorskip("textarena", reason="pip install 'teamtr[games]'")

from llm.problems.textarena_games import TextArenaGame, game_problems  # noqa: E402
from studies.llm.environments.fixed_walks import fixed_walks, won  # noqa: E402

STEP = {"down": (1, 0), "right": (0, 1)}


def grid_of(seed: int) -> list[list[str]]:
    game = TextArenaGame("FrozenLake-v0", n_agents=2)
    game.reset(game_problems("FrozenLake-v0", [seed])[0], seed)
    return game.env.state.game_state["grid"]


def reaches_the_goal(grid: list[list[str]], walk: tuple[str, ...]) -> bool:
    row = column = 0
    for move in walk:
        row, column = row + STEP[move][0], column + STEP[move][1]
        if not (0 <= row < len(grid) and 0 <= column < len(grid)) or grid[row][column] == "H":
            return False
    return grid[row][column] == "G"


def test_a_monotone_walk_wins_where_the_grid_says_it_reaches_the_goal():
    seeds = range(1234, 1240)
    walks = set(itertools.permutations(["down"] * 3 + ["right"] * 3))
    for seed in seeds:
        grid = grid_of(seed)
        assert sum(row.count("H") for row in grid) == 3
        for walk in walks:
            assert won("FrozenLake-v0", seed, walk) == reaches_the_goal(grid, walk), (seed, walk)


def test_the_table_ranks_walks_by_wins_and_counts_the_games_some_walk_wins():
    seeds = list(range(1234, 1238))
    result = fixed_walks("FrozenLake-v0", ["down", "right"], 6, seeds)
    wins = [walk["wins"] for walk in result["walks"]]
    assert len(wins) == 2**6 and wins == sorted(wins, reverse=True)
    assert result["best"]["wins"] == wins[0] <= result["won_by_some_walk"] <= len(seeds)
    monotone = set(itertools.permutations(["down"] * 3 + ["right"] * 3))
    grids = {seed: grid_of(seed) for seed in seeds}
    some = {s for s in seeds for w in monotone if reaches_the_goal(grids[s], w)}
    assert result["won_by_some_walk"] == len(some)
