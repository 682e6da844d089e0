"""Draw the swap-shock figure from ``teamtr swap-sim --json`` output (no training).

Usage: python figures/plot_swap_sim.py results/swap_sim.json figures/swap_sim.png

The figure is ``studies.tabular.swap_sim_plot.plot_swap_sim`` (its panels are described there);
``teamtr swap-sim --plot`` draws the same one.
"""

from __future__ import annotations

import sys

from studies.tabular.swap_sim_plot import plot_swap_sim

if __name__ == "__main__":
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    print(f"wrote {plot_swap_sim(sys.argv[1], sys.argv[2])}")
