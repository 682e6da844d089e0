"""More seeds of one row of gymnasium_check: Taxi-v4, uniform policy, 20,000 episodes each."""

import sys

from studies.tabular.gymnasium_check import check

for seed in range(int(sys.argv[1]), int(sys.argv[2])):
    r = check("Taxi-v4", ("uniform",), 0.95, 20000, seed)
    print(
        seed,
        round(r.exact_J, 4),
        round(r.mc_mean, 4),
        round(r.mc_standard_error, 4),
        round(r.z, 2),
        flush=True,
    )
