"""Fixtures of the llm tests (helpers live in llm_test_support.py)."""

from __future__ import annotations

import pytest
from llm_test_support import SHORT_SYSTEM_PROMPT, make_team

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
