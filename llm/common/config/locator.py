"""Where a bad key was written, and the error that says so.

``ConfigError`` is the one exception the config loader raises on any input; its message starts
with the place a ``Locator`` names: ``file:line: [section] key`` for a key of a file, or
``--set section.key`` for a value given on the command line. ``did_you_mean`` adds the closest
known name to a misspelt one.
"""

from __future__ import annotations

import difflib
import re
import typing
from dataclasses import dataclass


class ConfigError(ValueError):
    """A configuration file is invalid; the message names the file and the key."""


def did_you_mean(written: str, known: typing.Iterable[str]) -> str:
    """``"; did you mean 'stages'?"`` for the known name closest to a misspelt one (difflib's
    ratio, at least 0.6), else "": a list of every key does not say which one was meant."""
    close = difflib.get_close_matches(written, list(known), n=1)
    return f"; did you mean {close[0]!r}?" if close else ""


@dataclass(frozen=True)
class Locator:
    """Turns (section, key) into ``file:line: [section] key`` for messages, or, for a value
    given on the command line (``overridden``), into ``--set section.key``."""

    source: str
    text: str = ""
    overridden: frozenset[tuple[str, str]] = frozenset()
    """(section, key) of every ``--set`` value: its errors name the option, not the file."""

    def place(self, section: str, key: str | None = None) -> str:
        """Where a section (or one of its keys) was written: ``--set`` or the file."""
        if key is not None and (section, key) in self.overridden:
            return f"--set {section}.{key}"
        if key is None and any(written == section for written, _ in self.overridden):
            if self.line_of(section, None) is None:
                return f"--set {section}"
        return self.source

    def line_of(self, section: str, key: str | None) -> int | None:
        current = None
        for number, line in enumerate(self.text.splitlines(), start=1):
            header = re.match(r"\s*\[\s*([^\[\]]+?)\s*\]\s*(#.*)?$", line)
            if header:
                current = header.group(1).strip("\"'")
                if key is None and current == section:
                    return number
                continue
            if key is not None and current == section:
                if re.match(rf"\s*[\"']?{re.escape(key)}[\"']?\s*=", line):
                    return number
        return None

    def __call__(self, section: str, key: str | None = None) -> str:
        if key is not None and (section, key) in self.overridden:
            return self.place(section, key)
        number = self.line_of(section, key)
        place = f"{self.source}:{number}" if number else self.source
        return f"{place}: [{section}]" + (f" {key}" if key is not None else "")
