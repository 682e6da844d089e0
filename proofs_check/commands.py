"""The ``teamtr verify`` subcommand, registered in ``pyproject.toml``."""

from teamtr.cli import Command

VERIFY = Command("check every lemma and theorem on seeded random instances", "proofs_check.verify")
