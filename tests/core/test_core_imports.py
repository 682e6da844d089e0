"""The core is numpy/scipy only: importing it must never import torch."""

import subprocess
import sys


def test_import_teamtr_does_not_import_torch():
    code = (
        "import sys, teamtr, teamtr.stage, teamtr.cli\n"
        "import importlib\n"
        "for m in ('divergence','surrogate','turns','trust_region','bounds','alignment'):\n"
        "    try:\n"
        "        importlib.import_module('teamtr.' + m)\n"
        "    except ModuleNotFoundError as e:\n"
        "        if e.name != 'teamtr.' + m: raise\n"
        "print('torch' in sys.modules)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_cli_help_lists_every_public_subcommand():
    out = subprocess.run(
        [sys.executable, "-m", "teamtr.cli", "--help"], capture_output=True, text=True, check=True
    )
    for name in ("verify", "scaling", "sim-train", "train", "eval", "swap", "evaluate"):
        assert f"  {name} " in out.stdout
