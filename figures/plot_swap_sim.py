"""Draw the swap-shock figure from ``teamtr swap-sim --json`` output (no training).

Usage: python figures/plot_swap_sim.py results/swap_sim.json figures/swap_sim.png

Three panels, scores = (J - J_uniform) / (J_max - J_uniform) x 100 (0: uniform team, 100: optimal):
(a) per seed and mean: the trained team, right after a direct and an aligned swap, and after the
    further TeamTR stages (with the no-swap continuation for reference);
(b) the delta0 sweep: score right after the aligned swap and after further stages, against the
    direct swap;
(c) the SAT-style upgrade: trained team -> n-1 agents replaced -> all n, direct versus aligned.
"""

from __future__ import annotations

import sys

from sim.experiments.plots import plot_swap_sim

if __name__ == "__main__":
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    print(f"wrote {plot_swap_sim(sys.argv[1], sys.argv[2])}")
