"""The tabular studies: exact experiments on ``sim`` MDPs, each a ``teamtr`` subcommand, with
its figure in the ``*_plot`` module beside it. They never import torch.

- ``scaling`` (``teamtr scaling``): how the occupancy drift, the surrogate error and the certified
  penalty of one stage grow with the number of agents n, for the stale scheme (Thm 3.7) and
  TeamTR (Thm 3.6); figure ``scaling_plot``.
- ``sim_train`` (``teamtr sim-train``): multi-stage training of every scheme on built-in
  families, exact and sampled; figure ``sim_train_plot``.
- ``swap_sim`` (``teamtr swap-sim``, with ``swap_sim_settings`` and ``swap_sim_summary``): the
  exact swap-shock study, direct versus aligned swaps; figure ``swap_sim_plot``.
- ``gymnasium_check`` (``teamtr gymnasium-check``): exact J of ``sim.from_gymnasium`` MDPs
  against Gymnasium's own rollouts.

Shared: ``families`` (the built-in MDP families and the scaling study's turn-taking ring),
``training`` (exact TeamTR training checked against its certificates), ``measure`` (drift,
surrogate errors and penalties of a stage); exponents are fitted by ``teamtr.fitting``.
"""
