"""Tabular experiments behind ``teamtr scaling`` and ``teamtr sim-train``.

- ``scaling``: how the occupancy drift, the surrogate error and the certified penalty of one
  stage grow with the number of agents n, for the stale scheme (Thm 3.7) and TeamTR (Thm 3.6).
- ``sim_train``: multi-stage training of every scheme on built-in families, exact and sampled.
- ``gymnasium_check``: exact J of ``sim.from_gymnasium`` MDPs against Gymnasium's own rollouts.
- ``plots``: the figures drawn from the JSON files these commands write (never training).

Helpers: ``families`` (the turn-taking ring MDP of the scaling study), ``measure`` (drift,
surrogate errors and penalties of a stage), ``fitting`` (log-log exponents with a bootstrap).
"""
