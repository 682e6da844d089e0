"""Draw the training figure from ``teamtr sim-train --json`` output.

Usage: python figures/plot_sim_train.py results/sim_train.json figures/sim_train.png
"""

from __future__ import annotations

import sys

from studies.tabular.sim_train_plot import plot_sim_train

if __name__ == "__main__":
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    print(f"wrote {plot_sim_train(sys.argv[1], sys.argv[2])}")
