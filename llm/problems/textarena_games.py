"""TextArena's games (``pip install 'teamtr[games]'``: ``textarena`` 0.7.4) as environments.

``[task] kind = "environment"``, ``environment = "textarena:GuessTheNumber-v0"``: each problem
is one game, its seed (``Problem.metadata["seed"]``), so that the dialogues of a GRPO group
play the same game. The game's prompts and messages enter the context as the game writes them
(the raw registry entry, ``<id>-raw``: none of TextArena's observation wrappers); its own
rewards are the task's reward (``TextArenaGame.reward``: paid on the turn the game ends).

Two ways to play:

- ``players = 1`` (a single-player game: GuessTheNumber, Mastermind, TowerOfHanoi, FrozenLake,
  LightsOut, Countdown, ...) the team plays it together: the messages of the agents in
  ``acting`` (default: every agent) are the moves, the others' are advice the game does not
  read. The game's text is shared.
- ``players = n_agents``: agent k is player k; what the game shows player k is private to
  agent k, and the game names who moves next. The team's reward is the mean of the players'.

TextArena's games draw from Python's global ``random`` (a game seeds it at reset): every call
runs inside the session's own random state (``llm.conversation.environment_session``), so games are
reproducible and the rest of the process's draws untouched. A game that downloads data at run
time (NLTK's corpora: Wordle, Hangman, Codenames, ...) is refused with one line at reset.
"""

from __future__ import annotations

import importlib
import inspect
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from llm.problems.environment import EnvironmentFault, Opening, Reply
from llm.problems.tasks import Problem

PLAYER_ACTION = "PLAYER_ACTION"
"""TextArena's observation type of a player's own move: in the context already, as the message
the agent wrote."""
WIN_REWARD = 1.0
"""TextArena's reward of a won game (a lost or unfinished single-player game pays less: a share
of the way, 0 or -1, as each game decides)."""


def textarena() -> Any:
    """The ``textarena`` module, or one line saying how to install it."""
    try:
        return importlib.import_module("textarena")
    except ImportError:
        raise EnvironmentFault(
            "TextArena's games need the textarena package: pip install 'teamtr[games]' "
            "(textarena==0.7.4)"
        ) from None


def game_options(game: str) -> set[str] | None:
    """The keyword arguments the game's class takes (its registry entry's defaults overridable),
    or None where textarena or the game is missing (reset then says which in one line)."""
    try:
        registry = importlib.import_module("textarena.envs.registration").ENV_REGISTRY
    except ImportError:
        return None
    if f"{game}-raw" not in registry:
        return None
    entry_point = registry[f"{game}-raw"].entry_point
    if isinstance(entry_point, str):
        module, name = entry_point.split(":")
        entry_point = getattr(importlib.import_module(module), name)
    parameters = inspect.signature(entry_point).parameters
    return {name for name in parameters if name != "self"}


def game_ids() -> list[str]:
    """The registered TextArena games (each without its wrapper variants)."""
    registry = importlib.import_module("textarena.envs.registration").ENV_REGISTRY
    return sorted(i for i in registry if not i.endswith(("-raw", "-train")))


@dataclass
class TextArenaGame:
    """One dialogue's TextArena game (see the module's docstring)."""

    game: str
    """The registry id, e.g. "GuessTheNumber-v0"."""
    n_agents: int = 2
    players: int = 1
    acting: tuple[int, ...] = ()
    """With ``players = 1``: the agents whose messages are moves (() = every agent)."""
    blind: bool = False
    """Show the game's opening only: after each move the game's text (a hint, a board) is not
    shown, while its rewards and its end count as before. The ablation of a team without its
    environment's text: what a trained team gains over it is what it reads from the game."""
    options: Mapping[str, Any] = field(default_factory=dict)
    """Keyword arguments of the game (its registry entry's, overridden), e.g. max_number = 10;
    in a config, plain ``[task.environment_args]`` keys (``llm.problems.configured``)."""

    def __post_init__(self) -> None:
        if self.players not in (1, self.n_agents):
            raise EnvironmentFault(
                f"TextArena game {self.game}: players = {self.players}; give 1 (the team plays "
                f"one player together) or n_agents = {self.n_agents} (one agent a player)"
            )
        if any(not 0 <= k < self.n_agents for k in self.acting):
            raise EnvironmentFault(
                f"TextArena game {self.game}: acting {self.acting} names no agent"
            )
        self.env: Any = None

    def reset(self, problem: Problem, seed: int) -> Opening:
        ta = textarena()
        if self.game not in game_ids():
            import difflib

            close = difflib.get_close_matches(self.game, game_ids(), n=3)
            raise EnvironmentFault(
                f"TextArena has no game {self.game!r}"
                + (f"; did you mean {close}?" if close else "")
            )
        game_seed = int(problem.metadata.get("seed", seed))
        try:
            self.env = ta.make(f"{self.game}-raw", **dict(self.options))
            self.env.reset(num_players=self.players, seed=game_seed)
        except LookupError as error:  # nltk: a corpus it would download now
            resource = str(error).split("Resource")[-1].split("not found")[0].strip(" '\n*")
            raise EnvironmentFault(
                f"TextArena game {self.game} needs data it downloads at run time (NLTK's "
                f"{resource or 'corpora'}); choose a game that runs offline"
            ) from None
        texts = self._new_texts()
        current = self._current_player()
        if self.players == 1:
            return Opening(texts[0])
        return Opening(
            f"A game of {self.game} for {self.players} players; agent k is Player k.",
            private=texts,
            first_speaker=current,
        )

    def step(self, speaker: int, message: str) -> Reply:
        if self.players == 1 and self.acting and speaker not in self.acting:
            return Reply()  # advice: the game reads moves only
        done, _ = self.env.step(message)
        texts = self._new_texts()  # read (and cleared) even when blind: the game's queue
        if self.blind:
            texts = dict.fromkeys(texts, "")
        reward = self._team_reward() if done else 0.0
        if self.players == 1:
            return Reply(text=texts[0], reward=reward, done=bool(done))
        return Reply(
            private=texts,
            reward=reward,
            done=bool(done),
            next_speaker=None if done else self._current_player(),
        )

    # -- reading the game ---------------------------------------------------------------------
    def _current_player(self) -> int:
        return int(self.env.state.current_player_id)

    def _new_texts(self) -> dict[int, str]:
        """Per player, what the game showed it since the last call, its own moves left out
        (``State.observations`` is the queue TextArena's ``get_observation`` empties)."""
        queues = self.env.state.observations
        texts = {}
        for player in range(self.players):
            shown = [
                text
                for _, text, kind in queues.get(player, [])
                if getattr(kind, "name", "") != PLAYER_ACTION
            ]
            queues[player] = []
            texts[player] = "\n".join(shown)
        return texts

    def _team_reward(self) -> float:
        rewards = self.env.close()[0] or {}
        if not rewards:
            return 0.0
        return sum(float(r) for r in rewards.values()) / len(rewards)


def game_problems(name: str, seeds: list[int]) -> list[Problem]:
    """One problem per game seed."""
    return [Problem(f"{name} #{seed}", "", metadata={"seed": seed}) for seed in seeds]
