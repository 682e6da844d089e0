"""The MDP families of the tabular experiments; the scaling study's ring of n speakers.

``FAMILIES`` and ``build_family`` name the seeded instances ``teamtr sim-train`` and
``teamtr swap-sim`` train on.

``turn_taking_ring`` grows with n in the one way the study needs: every agent owns the same
number of states, every transition hands the turn to the next agent, and the start
distribution is uniform over all states. Consequences (THEORY.md §1):

- each agent's share of the discounted occupancy is exactly 1/n for every team policy (the
  turn moves one step round the ring per time step and starts uniformly), so no agent is
  irrelevant and the per-agent problem has the same size and difficulty for every n;
- an update of agent k moves the occupancy of every later speaker, so the updates of one stage
  interact the way Thm 3.7 describes (the later agents' training distribution drifts).
"""

from __future__ import annotations

import numpy as np

import sim


def turn_taking_ring(
    n_agents: int,
    states_per_agent: int = 6,
    n_actions: int = 3,
    gamma: float = 0.9,
    successors: int = 3,
    seed: int = 0,
) -> sim.TurnTakingMDP:
    """A seeded random turn-taking MDP whose turn passes from agent k to agent (k+1) mod n.

    Agent k owns states ``k*m .. (k+1)*m - 1`` (m = ``states_per_agent``). Each state-action
    pair moves to ``successors`` random states of the next agent's block with Dirichlet(1)
    probabilities and pays a reward drawn uniformly from [0, 1].
    """
    if n_agents < 1:
        raise ValueError(f"n_agents must be >= 1, got {n_agents}")
    if states_per_agent < 1 or n_actions < 1:
        raise ValueError(
            f"states_per_agent and n_actions must be >= 1, got {states_per_agent}, {n_actions}"
        )
    if not 1 <= successors <= states_per_agent:
        raise ValueError(
            f"successors must lie in 1..states_per_agent={states_per_agent}, got {successors}"
        )
    rng = np.random.default_rng([seed, n_agents, states_per_agent, n_actions])
    n_states = n_agents * states_per_agent
    agent_of_state = np.repeat(np.arange(n_agents), states_per_agent)
    transitions = np.zeros((n_states, n_actions, n_states))
    for s in range(n_states):
        next_block = ((agent_of_state[s] + 1) % n_agents) * states_per_agent
        for a in range(n_actions):
            targets = next_block + rng.choice(states_per_agent, size=successors, replace=False)
            transitions[s, a, targets] = rng.dirichlet(np.ones(successors))
    rewards = rng.uniform(0.0, 1.0, size=(n_states, n_actions))
    start = np.full(n_states, 1.0 / n_states)
    return sim.TurnTakingMDP(transitions, rewards, start, gamma, agent_of_state)


FAMILIES: dict[str, str] = {
    "random": "sim.random_mdp: 40 states, 3 actions, 4 agents, gamma 0.9, random successors",
    "coordination": "sim.coordination_game: 3 agents; a later agent's best response depends on "
    "an earlier agent's behaviour",
    "ring": "turn_taking_ring: 4 agents x 6 states, the turn passes round the ring, gamma 0.9",
}


def build_family(name: str, seed: int) -> sim.TurnTakingMDP:
    """One seeded instance of a built-in family (see ``FAMILIES``)."""
    if name == "random":
        return sim.random_mdp(n_states=40, n_actions=3, n_agents=4, gamma=0.9, seed=seed)
    if name == "coordination":
        return sim.coordination_game(n_agents=3, seed=seed)
    if name == "ring":
        return turn_taking_ring(4, states_per_agent=6, n_actions=3, gamma=0.9, seed=seed)
    raise ValueError(f"unknown family {name!r}; choose from {sorted(FAMILIES)}")
