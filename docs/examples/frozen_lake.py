"""sim.from_gymnasium on FrozenLake: exact J against Gymnasium's own rollouts; two agents."""

import gymnasium
import numpy as np

import sim
from studies.tabular.gymnasium_check import gymnasium_returns

env = gymnasium.make("FrozenLake-v1", is_slippery=True)
mdp = sim.from_gymnasium(env, gamma=0.95)  # 16 tiles + 1 absorbing state
team = sim.uniform_team(mdp)
print(mdp, "J =", round(sim.evaluate(mdp, team).J, 6))

# Gymnasium's own step(), 100,000 seeded episodes, geometric stop with probability 1 - gamma
returns = gymnasium_returns("FrozenLake-v1", [team.table[:16]], 0.95, 100_000, seed=0)
print(f"Monte-Carlo {returns.mean():.6f} ± {returns.std(ddof=1) / np.sqrt(returns.size):.6f}")

pair = sim.from_gymnasium(env, gamma=0.95, n_agents=2)  # turns alternate: 2 x 16 + 1 states
leans_right = np.tile([0.1, 0.2, 0.6, 0.1], (16, 1))  # agent 1 leans RIGHT (action 2)
both = sim.alternating_team(pair, [team.table[:16], leans_right])
print(pair, "J =", round(sim.evaluate(pair, both).J, 6))
