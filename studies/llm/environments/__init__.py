"""The studies of docs/environments.md: ``held_out_at_stage`` puts several methods' runs side by
side at one stage (held out, CPU) and draws their curves; ``fixed_walks`` plays every fixed
move sequence on a game's held-out seeds, what a team that never reads the game could win.
"""
