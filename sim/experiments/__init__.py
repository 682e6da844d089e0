"""Tabular experiments behind ``teamtr scaling``, ``teamtr sim-train`` and ``teamtr swap-sim``.

- ``scaling``: how the occupancy drift, the surrogate error and the certified penalty of one
  stage grow with the number of agents n, for the stale scheme (Thm 3.7) and TeamTR (Thm 3.6).
- ``sim_train``: multi-stage training of every scheme on built-in families, exact and sampled.
- ``swap`` (with ``swap_settings`` and ``swap_summary``): the exact swap-shock study, direct versus
  aligned swaps.
- ``gymnasium_check``: exact J of ``sim.from_gymnasium`` MDPs against Gymnasium's own rollouts.
- ``plots``: the figures drawn from the JSON files these commands write (never training).

Shared: ``families`` (the built-in MDP families and the scaling study's turn-taking ring),
``training`` (exact TeamTR training checked against its certificates), ``measure`` (drift,
surrogate errors and penalties of a stage), ``fitting`` (log-log exponents with a bootstrap).
"""
