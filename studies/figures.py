"""What the studies' figures share: matplotlib without a display, a result read from its JSON
file (or handed over as the dict), the schemes' colours, and a figure laid out, written as a
PNG and closed.

Only the ``*_plot`` modules import this one, and only when a figure is drawn: running a study
without ``--plot`` does not import matplotlib.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

Source = str | Path | dict[str, Any]
"""A study's result: the path of its ``--json`` file, or the document itself."""

SCHEME_COLOURS = {
    "stale": "tab:red",
    "teamtr": "tab:blue",
    "joint": "tab:green",
    "happo": "tab:purple",
    "single": "tab:gray",
}


def load_result(source: Source) -> dict[str, Any]:
    """The result document of ``source`` (read from its JSON file unless it is the dict)."""
    if isinstance(source, dict):
        return source
    loaded: dict[str, Any] = json.loads(Path(source).read_text())
    return loaded


def save_figure(figure: Any, out: str | Path) -> Path:
    """Lay out, write (PNG, 120 dpi) and close ``figure``; its folder is made if missing."""
    path = Path(out)
    figure.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, dpi=120)
    plt.close(figure)
    return path
