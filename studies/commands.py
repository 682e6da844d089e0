"""The ``teamtr`` subcommands of the studies, registered in ``pyproject.toml``.

Each names the module that implements it (``build_parser(prog)`` and ``run(args)``); that module
is imported only when its subcommand runs, so ``teamtr --help`` imports no study, and the
tabular studies never import torch.
"""

from teamtr.cli import Command

SCALING = Command("measure the n^2 (stale) vs n (teamtr) drift scaling", "studies.tabular.scaling")
SIM_TRAIN = Command("multi-stage tabular training of every scheme", "studies.tabular.sim_train")
SWAP_SIM = Command(
    "exact swap-shock study: direct versus aligned swaps", "studies.tabular.swap_sim"
)
GYMNASIUM_CHECK = Command(
    "exact J of Gymnasium toy-text MDPs against Gymnasium's own rollouts",
    "studies.tabular.gymnasium_check",
)
LLM_SCALING = Command(
    "measure the n^2 (stale) vs n (teamtr) drift on language-model teams",
    "studies.llm.drift.scaling",
)
SEED_STUDY = Command(
    "train every method with every seed under one budget, then aggregate",
    "studies.llm.seed_study",
)
COMPARE_REPORT = Command(
    "summarise finished runs and their evaluations: one JSON, one figure",
    "studies.llm.compare_report",
)
