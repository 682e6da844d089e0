"""The language-model subcommands of ``teamtr``, registered in ``pyproject.toml`` (the studies
of language-model teams, e.g. ``teamtr llm-scaling``, are ``studies.commands``).

``llm.interface.cli`` parses their options itself (``argv`` is forwarded unparsed); it is imported only when
one of them runs, so ``teamtr --help`` does not import torch.
"""

from teamtr.cli import Command

USING = "using a team (run `teamtr <command> --help` for its options and examples)"
"""The heading of these commands in ``teamtr --help``."""

TRAIN = Command(
    "train a team of language models from a TOML config",
    "llm.interface.cli",
    forward_argv=True,
    group=USING,
    order=1,
)
EVAL = Command(
    "evaluate a trained (or untrained) team on a dataset",
    "llm.interface.cli",
    forward_argv=True,
    group=USING,
    order=2,
)
CHAT = Command(
    "ask a trained team a question of one's own (one dialogue, or a prompt loop)",
    "llm.interface.cli",
    forward_argv=True,
    group=USING,
    order=3,
)
PLOT = Command(
    "draw a run's training reward and held-out curve to a PNG",
    "llm.interface.cli",
    forward_argv=True,
    group=USING,
    order=4,
)
EXPORT = Command(
    "write a trained team as PEFT adapters, team.json and a vLLM serve line",
    "llm.interface.cli",
    forward_argv=True,
    group=USING,
    order=5,
)
SWAP = Command(
    "replace one agent of a run by another model, optionally after Stage-0 alignment",
    "llm.interface.cli",
    forward_argv=True,
    group=USING,
    order=6,
)
