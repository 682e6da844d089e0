"""The ``teamtr`` console script: it discovers subcommands and dispatches; it knows none of them.

Each package registers its subcommands as ``teamtr.Command`` values under the entry-point group
``teamtr.commands`` of ``pyproject.toml`` (the way pytest finds its plugins), for example::

    [project.entry-points."teamtr.commands"]
    verify = "proofs_check.commands:VERIFY"

A ``Command`` names the module that implements it; that module is imported only when its
subcommand runs, so ``teamtr --help`` and the tabular commands never import torch, and the core
imports no backend (imports point down: backends and tools import the core, never the reverse).
"""

from __future__ import annotations

import importlib
import sys
import tomllib
from collections.abc import Sequence
from dataclasses import dataclass
from importlib.metadata import entry_points
from pathlib import Path

ENTRY_POINT_GROUP = "teamtr.commands"


@dataclass(frozen=True)
class Command:
    """One subcommand of ``teamtr``, as a package registers it."""

    help: str
    """The one-line description shown by ``teamtr --help``."""
    module: str
    """The module that implements it: ``build_parser(prog)`` and ``run(args) -> int``, or, when
    ``forward_argv`` is set, ``main(argv) -> int`` with ``argv`` starting at the subcommand."""
    forward_argv: bool = False
    """Hand the unparsed command line to ``module.main`` (a package with its own parser)."""
    group: str = ""
    """The heading ``teamtr --help`` lists it under ("" : ``STUDIES``, the research studies)."""
    order: int = 0
    """Its place in its group (then its name): a group reads in the order one uses it."""

    def __call__(self, name: str, argv: Sequence[str]) -> int:
        """Run the subcommand ``name`` with the arguments after it."""
        module = importlib.import_module(self.module)
        if self.forward_argv:
            return int(module.main([name, *argv]))
        args = module.build_parser(f"teamtr {name}").parse_args(list(argv))
        return int(module.run(args))


@dataclass(frozen=True)
class Unavailable(Command):
    """An installed entry point that cannot be loaded; running it explains why."""

    value: str = ""
    reason: str = ""

    def __init__(self, name: str, value: str, reason: str) -> None:
        object.__setattr__(self, "help", f"(unavailable: {reason})")
        object.__setattr__(self, "module", value.partition(":")[0])
        object.__setattr__(self, "forward_argv", False)
        object.__setattr__(self, "group", "")
        object.__setattr__(self, "order", 0)
        object.__setattr__(self, "value", value)
        object.__setattr__(self, "reason", reason)

    def __call__(self, name: str, argv: Sequence[str]) -> int:
        print(
            f"teamtr: command {name!r} cannot be loaded from its entry point {self.value!r} "
            f"({self.reason}); the installation is stale: reinstall the package "
            "(pip install -e .)",
            file=sys.stderr,
        )
        return 2


def registered_commands() -> dict[str, Command]:
    """Every subcommand installed packages register, by name, in registration order.

    When no installed package registers any, as in a source checkout run without installing it
    (``PYTHONPATH=. python -m teamtr``, e.g. on a machine without a package index), the
    subcommands are those the checkout's ``pyproject.toml`` declares.
    """
    commands: dict[str, Command] = {}
    for entry in entry_points(group=ENTRY_POINT_GROUP):
        try:
            loaded = entry.load()
        except (ImportError, AttributeError) as error:
            # A stale installation (an entry point whose module or name is gone) must not take
            # every other command down with it: this one says what is wrong when it is run.
            commands.setdefault(entry.name, Unavailable(entry.name, entry.value, str(error)))
            continue
        commands.setdefault(entry.name, _checked(entry.name, entry.value, loaded))
    if not commands:
        for name, value in source_checkout_entry_points().items():
            module, _, attribute = value.partition(":")
            loaded = getattr(importlib.import_module(module), attribute)
            commands.setdefault(name, _checked(name, value, loaded))
    return commands


def _checked(name: str, value: str, command: object) -> Command:
    if not isinstance(command, Command):
        raise TypeError(
            f"entry point {name} = {value!r} of group {ENTRY_POINT_GROUP!r} "
            f"must name a teamtr.cli.Command, got {type(command).__name__}"
        )
    return command


def source_checkout_entry_points() -> dict[str, str]:
    """The ``teamtr.commands`` entry points of the ``pyproject.toml`` beside this package."""
    pyproject = Path(__file__).resolve().parents[1] / "pyproject.toml"
    if not pyproject.is_file():
        return {}
    project = tomllib.loads(pyproject.read_text()).get("project", {})
    if project.get("name") != "teamtr":
        return {}
    return dict(project.get("entry-points", {}).get(ENTRY_POINT_GROUP, {}))


STUDIES = "research studies (the theorems, the tabular worlds, measurements)"
"""The heading of the commands that name no group."""


def usage(commands: dict[str, Command]) -> str:
    lines = ["usage: teamtr <command> [options]"]
    width = max([10, *map(len, commands)])
    groups: dict[str, list[tuple[int, str, Command]]] = {}
    for name, command in commands.items():
        groups.setdefault(command.group or STUDIES, []).append((command.order, name, command))
    # Named groups first (a package's own commands), the research studies last.
    for heading in sorted(groups, key=lambda g: g == STUDIES):
        lines += ["", f"{heading}:"]
        lines += [f"  {n:<{width}} {c.help}" for _, n, c in sorted(groups[heading], key=_place)]
    if not commands:
        lines += ["", "commands:"]
        lines.append(f"  (none: no installed package registers the {ENTRY_POINT_GROUP!r} group)")
    lines += ["", "Run `teamtr <command> --help` for the options of one command."]
    return "\n".join(lines)


def _place(entry: tuple[int, str, Command]) -> tuple[int, str]:
    return entry[0], entry[1]


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    commands = registered_commands()
    if not argv or argv[0] in ("-h", "--help"):
        print(usage(commands))
        return 0 if argv else 2
    name, rest = argv[0], argv[1:]
    if name not in commands:
        print(f"teamtr: unknown command {name!r}\n\n{usage(commands)}", file=sys.stderr)
        return 2
    return commands[name](name, rest)


if __name__ == "__main__":
    # Run as ``python -m teamtr.cli``, this file is ``__main__``; the packages' commands are
    # instances of ``teamtr.cli.Command``, so dispatch through that module.
    from teamtr.cli import main as package_main

    raise SystemExit(package_main())
