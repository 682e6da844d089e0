"""``teamtr export``: a trained run written out as PEFT adapters, a team description and the
vLLM lines (``llm.export.export_folder`` holds what is written and why).

The run and the step are checked, and ``--out`` must be a new (or empty) folder, before the
model loads; a bad one is one ``error:`` line and exit code 2 (``llm.interface.cli``).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from llm.common.config import ConfigError
from llm.interface.cli_args import add_command, integer_at_least

EXAMPLES = """examples:
  teamtr export --run runs/try --out exported_team
  teamtr export --run runs/try --step 2 --out team_step2 --merge"""


def add_parser(commands: Any) -> None:
    """``teamtr export``: its line in the list of commands, its ``--help`` and its options."""
    parser = add_command(
        commands,
        "export",
        "write a trained team as PEFT adapters for vLLM",
        "Write a checkpoint as a folder that opens without teamtr: one PEFT adapter per "
        "agent, the tokenizer, team.json (how a dialogue is rendered), a model card with "
        "the lines that build the base, and the vLLM line that serves it from that folder "
        "(--with-base writes the base vLLM loads, a GGUF source's dequantised weights).",
        EXAMPLES,
    )
    add_arguments(parser)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--run", required=True, help="run directory of `teamtr train`")
    parser.add_argument("--out", required=True, help="the export folder to write (new or empty)")
    parser.add_argument(
        "--step", type=integer_at_least(0), help="checkpoint stage (default: the latest)"
    )
    parser.add_argument(
        "--with-base",
        action="store_true",
        help="also write the base model as a safetensors folder, base/, which vLLM serves (a "
        "GGUF source as its dequantised weights: vLLM has no GGUF loader)",
    )
    parser.add_argument(
        "--merge",
        action="store_true",
        help="also write one merged model per agent (W + alpha/r B A): merged/agentK",
    )
    parser.add_argument("--device", help='where the models go while writing (default: "cpu")')
    parser.add_argument(
        "--host",
        default="127.0.0.1",
        help="the address the vLLM lines listen on (default: 127.0.0.1, this machine only; "
        "0.0.0.0, every interface, only behind a firewall or a TLS proxy)",
    )


def run_export(args: argparse.Namespace) -> int:
    from llm.export.export_folder import LOOPBACK, export_team
    from llm.export.trained_team import TEAM_FILE, locate_team

    out = Path(args.out)
    if not args.host or any(c.isspace() for c in args.host):
        raise ConfigError(f"--host {args.host!r}: give an address to listen on, e.g. {LOOPBACK}")
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise ConfigError(f"--out {out}: exists and is not empty; give a new folder")
    source = locate_team(args.run, args.step)
    trained = source.load(args.device or "cpu")
    written = export_team(trained, out, with_base=args.with_base, merge=args.merge, host=args.host)
    team = json.loads((written / TEAM_FILE).read_text())
    print(f"exported {trained.checkpoint} to {written}")
    print(team["vllm"])
    return 0
