"""What tabular validation refuses: one line per case, the error type and its message."""

import numpy as np

import sim

mdp = sim.random_mdp(12, 3, 2, gamma=0.9, seed=0)
table = np.full((12, 3), 1 / 3)
cases = {
    "map of another MDP": lambda: sim.evaluate(mdp, sim.TabularTeam(table, 1 - mdp.agent_of_state)),
    "ids with a gap": lambda: sim.TabularTeam(table[:6], [0, 5, 0, 1, 1, 0]),
    "id 0.5": lambda: sim.TabularTeam(table[:3], [0, 0.5, 1]),
    "id 2**40": lambda: sim.TabularTeam(table[:3], [0, 2**40, 1]),
    "R = 1e308": lambda: sim.evaluate(
        m := sim.TurnTakingMDP(np.full((2, 1, 2), 0.5), [[1e308], [1e308]], [1, 0], 0.9, [0, 0]),
        sim.uniform_team(m),
    ),
    "rtol = 0": lambda: sim.evaluate(mdp, sim.uniform_team(mdp), rtol=0.0),
}
for name, case in cases.items():
    try:
        case()
    except (ValueError, ArithmeticError) as error:
        print(f"{name}: {type(error).__name__}: {error}")
