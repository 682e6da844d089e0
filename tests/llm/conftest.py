"""Fixtures of the llm tests (helpers live in llm_test_support.py)."""

from __future__ import annotations

from pathlib import Path

import pytest
from llm_test_support import SHORT_SYSTEM_PROMPT, make_team
from team_out_support import train_notes_team

from llm.conversation.dialogue import ChatFormat
from llm.models.agents import LoraTeam
from llm.models.loading import tiny_char_tokenizer


@pytest.fixture(scope="session")
def char_tokenizer():
    return tiny_char_tokenizer()


@pytest.fixture
def char_team(char_tokenizer) -> LoraTeam:
    return make_team(len(char_tokenizer), 3)


@pytest.fixture
def char_chat(char_tokenizer) -> ChatFormat:
    return ChatFormat.from_tokenizer(char_tokenizer, 3, system_prompt=SHORT_SYSTEM_PROMPT)


@pytest.fixture(scope="session")
def notes_run(tmp_path_factory) -> Path:
    """The tiny team with private notes of ``team_out_support``, trained once for every test
    that reads it (chat, export, eval --data): its run directory. Tests write elsewhere."""
    return train_notes_team(tmp_path_factory.mktemp("notes"))
