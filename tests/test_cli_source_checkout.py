"""``python -m teamtr`` from a source checkout that was never installed (no entry points)."""

from __future__ import annotations

import pytest

import teamtr.cli
from teamtr.cli import Command, registered_commands, source_checkout_entry_points


def test_without_installed_entry_points_the_checkouts_pyproject_declares_the_commands(
    monkeypatch,
):
    installed = registered_commands()
    assert installed, "this environment has the package installed"
    declared = source_checkout_entry_points()
    assert set(declared) == set(installed)
    monkeypatch.setattr(teamtr.cli, "entry_points", lambda group: [])
    from_checkout = registered_commands()
    assert from_checkout == installed
    assert all(isinstance(c, Command) for c in from_checkout.values())


def test_a_checkout_entry_that_is_not_a_command_is_refused(monkeypatch):
    monkeypatch.setattr(teamtr.cli, "entry_points", lambda group: [])
    monkeypatch.setattr(
        teamtr.cli, "source_checkout_entry_points", lambda: {"bad": "teamtr.cli:main"}
    )
    with pytest.raises(TypeError, match="must name a teamtr.cli.Command"):
        registered_commands()
