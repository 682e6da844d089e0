"""Print the accuracy table of a `teamtr eval` results file as markdown rows: the whole set,
seen and eval-only templates, each difficulty and each template (n, accuracy ± s.e. in %;
a results file of a score gives the score).

    python results/tasks/accuracy_table.py results/tasks/untrained_mixed_d1.json
"""

from __future__ import annotations

import json
import sys


def rows(result: dict[str, float]) -> list[str]:
    groups = ["", "seen_templates/", "eval_only_templates/"]
    groups += sorted(
        key.removesuffix("n")
        for key in result
        if key.startswith(("difficulty/", "template/")) and key.endswith("/n")
    )
    return [
        f"| {group.rstrip('/') or 'all'} | {int(result[group + 'n'])} | "
        f"{100 * result.get(group + 'accuracy', result.get(group + 'score', 0.0)):.1f} ± "
        f"{100 * result[group + 'standard_error']:.1f} |"
        for group in groups
        if group + "n" in result
    ]


if __name__ == "__main__":
    with open(sys.argv[1]) as handle:
        print("\n".join(rows(json.load(handle))))
