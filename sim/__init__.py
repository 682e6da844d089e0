"""Tabular turn-taking MDPs with exact occupancies, values and trust-region updates.

The exact world of teamtr (ARCHITECTURE.md, "The tabular world"): ``TurnTakingMDP`` and its
generators, exact ``evaluate``, the team, samplers and updater that ``teamtr.stage`` drives,
Gymnasium environments registered under ``teamtr/...-v0`` on import, and ``from_gymnasium``,
which reads a Gymnasium toy-text environment into a TurnTakingMDP.

>>> import sim
>>> mdp = sim.random_mdp(n_states=50, n_actions=3, n_agents=2, gamma=0.9, seed=0)
>>> result = sim.evaluate(mdp, sim.uniform_team(mdp))
>>> round(float(result.d.sum()), 12)
1.0
"""

from sim.dialogue import (
    TokenFactorisation,
    dialogue_mdp,
    message_probs_from_token_logits,
    per_token_kl_sum,
)
from sim.env import ENV_IDS, TurnTakingEnv, register_envs
from sim.evaluate import Evaluation, NonFiniteResultError, evaluate, policy_kernel
from sim.generators import coordination_game, random_mdp, tree_mdp
from sim.linear import SolverError
from sim.mdp import MDPValidationError, TurnTakingMDP
from sim.rollouts import (
    EpisodeBatch,
    ExactRollouts,
    ExactSampler,
    SampledSampler,
    TabularRollouts,
    surrogate_scale,
)
from sim.team import (
    PolicyValidationError,
    TabularTeam,
    TeamMismatchError,
    random_team,
    uniform_team,
)
from sim.toy_text import GymnasiumConversionError, alternating_team, from_gymnasium
from sim.updates import ExactUpdater

register_envs()

__all__ = [
    "ENV_IDS",
    "EpisodeBatch",
    "Evaluation",
    "ExactRollouts",
    "ExactSampler",
    "ExactUpdater",
    "GymnasiumConversionError",
    "MDPValidationError",
    "NonFiniteResultError",
    "PolicyValidationError",
    "SampledSampler",
    "SolverError",
    "TeamMismatchError",
    "TabularRollouts",
    "TabularTeam",
    "TokenFactorisation",
    "TurnTakingEnv",
    "TurnTakingMDP",
    "alternating_team",
    "coordination_game",
    "dialogue_mdp",
    "evaluate",
    "from_gymnasium",
    "message_probs_from_token_logits",
    "per_token_kl_sum",
    "policy_kernel",
    "random_mdp",
    "random_team",
    "register_envs",
    "surrogate_scale",
    "tree_mdp",
    "uniform_team",
]
