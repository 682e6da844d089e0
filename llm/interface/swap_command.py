"""``teamtr swap``'s command line: its options, and the swap itself (``llm.interface.swap``,
which loads torch models) imported only when a swap runs, so that ``teamtr --help`` and a bad
argument of any command stay light."""

from __future__ import annotations

import argparse
from typing import Any

from llm.interface.cli_args import add_check_flag, add_command, integer_at_least, positive_number

EXAMPLES = """examples:
  teamtr swap --run runs/a --agent 1 --model runs/b            # -> runs/a-swap1-direct
  teamtr swap --run runs/a --agent 1 --model runs/b --align    # Stage-0 alignment first"""


def add_parser(commands: Any) -> None:
    """``teamtr swap``: its line in the list of commands, its ``--help`` and its options."""
    parser = add_command(
        commands,
        "swap",
        "replace one agent by another adapter, directly or after Stage-0 alignment",
        "Replace agent k of a trained team by another adapter and measure the team before "
        "and after, directly or after Stage-0 alignment of the newcomer (docs/llm_results.md).",
        EXAMPLES,
    )
    add_arguments(parser)
    add_check_flag(parser)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The options of ``teamtr swap``; every number has its range."""
    parser.add_argument("--run", required=True, help="run directory whose team gets the new agent")
    parser.add_argument("--agent", type=int, required=True, help="k: the agent to replace")
    parser.add_argument(
        "--model",
        required=True,
        help="π_pre: another run directory, a .safetensors adapter, or a PEFT adapter directory",
    )
    parser.add_argument(
        "--model-agent",
        type=int,  # its range (the model run's agents) is checked once that run is read
        help="when --model is a run directory: its agent (default k)",
    )
    parser.add_argument(
        "--step",
        type=int,  # must name one of --run's checkpoints, checked when it is read
        help="checkpoint stage of --run to swap into (default: the newest)",
    )
    parser.add_argument(
        "--align",
        action="store_true",
        help="Stage-0 alignment: project π_pre into E KL(π‖π_cur) <= δ0 before the swap",
    )
    parser.add_argument(
        "--delta0",
        type=positive_number,
        default=0.02,
        help="δ0, the alignment radius (nats per token)",
    )
    parser.add_argument(
        "--probe",
        help='JSONL of {"question", "answer"} probe prompts (default: drawn from the training split)',
    )
    parser.add_argument(
        "--probe-size",
        type=integer_at_least(1, 100_000),
        default=16,
        help="probe prompts used (one dialogue each)",
    )
    parser.add_argument(
        "--probe-seed",
        type=integer_at_least(0, 2**63 - 1),
        default=0,
        help="seed of probe draws and dialogues",
    )
    parser.add_argument(
        "--align-steps",
        type=integer_at_least(0, 100_000),
        default=8,
        help="gradient steps after the interpolation",
    )
    parser.add_argument(
        "--align-lr",
        type=positive_number,
        default=2e-4,
        help="Adam step size of those gradient steps",
    )
    parser.add_argument(
        "--stages",
        type=integer_at_least(1),
        help="[stage] stages of the new run's config: total stages `train --resume` runs to "
        "(default: the source run's); the source's elapsed time still counts toward "
        "[run] time_budget_minutes",
    )
    parser.add_argument(
        "--out", help="new run directory (default: <run>-swap<k>-direct or -aligned next to --run)"
    )


def run_swap(args: argparse.Namespace) -> int:
    """``teamtr swap``, its options parsed: ``llm.interface.swap.run_swap``."""
    from llm.interface import swap

    return swap.run_swap(args)
