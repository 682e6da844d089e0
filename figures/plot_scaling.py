"""Draw the scaling figure from ``teamtr scaling --json`` output.

Usage: python figures/plot_scaling.py results/scaling.json figures/scaling.png
"""

from __future__ import annotations

import sys

from studies.tabular.scaling_plot import plot_scaling

if __name__ == "__main__":
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    print(f"wrote {plot_scaling(sys.argv[1], sys.argv[2])}")
