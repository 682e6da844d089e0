"""An agent's view of a dialogue as chat messages (``llm.export.chat_messages``), without a
server: rendered by the chat template as a vLLM server renders a chat request, the messages
are teamtr's own rendering token for token on random dialogues (three speakers, one without a
role prompt, one without a note, messages cut before their stop token and ended by it); a
template that writes a BOS at every rendering, or refuses a later system message, is found out
in words; an export states each agent's view, the model card's ``view`` code builds the same
messages, and the completions client ships with it; ``teamtr chat --url`` refuses a bad
address, a key variable that is not set and a server that is not there in one line, exit 2.
"""

from __future__ import annotations

import json
import random
import re

import pytest
from llm_test_support import free_port, teamtr
from team_out_support import ROWS

from llm.conversation.dialogue import ChatFormat, Episode, Turn
from llm.export.chat_messages import chat_route_differs, rendered_as_served, view_messages
from llm.interface.cli import main
from llm.models.loading import CHATML_TEMPLATE, tiny_char_tokenizer
from llm.problems.tasks import Problem

SYSTEM = "Add the numbers."
ROLES = ("You know a.", "", "Answer with the sum.")
NOTES = ("a = 3", "", "c = 1")


def random_episode(chat: ChatFormat, tokenizer, rng: random.Random, notes) -> Episode:
    """Six turns of random speakers; each message random printable characters (a space or a
    newline among them), ended by the stop token or cut before it."""
    characters = [tokenizer.convert_tokens_to_ids(c) for c in "ab 1+\n.?"]
    turns = []
    for _ in range(6):
        message = [rng.choice(characters) for _ in range(rng.randint(1, 7))]
        if rng.random() < 0.6:
            message.append(chat.stop_id)
        turns.append(Turn(rng.randrange(3), tuple(message)))
    question = "What is 3 + 4 + 1?"
    problem = Problem(question, "", notes=notes)
    return Episode(problem, tuple(chat.encode_prompt(question)), 0, tuple(turns))


@pytest.mark.parametrize("notes", [NOTES, ()])
def test_chat_messages_render_every_view_as_teamtr_does(notes):
    tokenizer = tiny_char_tokenizer()
    chat = ChatFormat.from_tokenizer(tokenizer, 3, SYSTEM, ROLES)
    rng = random.Random(7)
    compared = 0
    for _ in range(20):
        episode = random_episode(chat, tokenizer, rng, notes)
        for t in range(len(episode.turns) + 1):
            so_far = episode.with_turns(episode.turns[:t])
            texts = [
                (turn.agent, tokenizer.decode([i for i in turn.message if i != chat.stop_id]))
                for turn in so_far.turns
            ]
            for speaker in range(3):
                messages = view_messages(
                    SYSTEM, ROLES, episode.problem.question, notes, texts, speaker
                )
                assert rendered_as_served(tokenizer, messages) == chat.context(so_far, speaker)
                compared += 1
    assert compared == 20 * 7 * 3


def test_a_template_that_renders_each_piece_otherwise_is_found_out():
    tokenizer = tiny_char_tokenizer()
    tokenizer.chat_template = "{{ bos_token }}" + CHATML_TEMPLATE  # as Llama 3's begins
    chat = ChatFormat.from_tokenizer(tokenizer, 3, SYSTEM, ROLES)
    differs = chat_route_differs(chat, tokenizer, SYSTEM, ROLES)
    assert differs is not None
    assert differs.startswith("speaker 0's view before turn 1") and "<|endoftext|>" in differs
    tokenizer.chat_template = (
        "{% for m in messages %}{% if m['role'] == 'system' and not loop.first %}"
        "{{ raise_exception('one system message, first') }}{% endif %}{% endfor %}"
        + CHATML_TEMPLATE
    )
    chat = ChatFormat.from_tokenizer(tokenizer, 3, SYSTEM, ROLES)
    differs = chat_route_differs(chat, tokenizer, SYSTEM, ROLES)
    assert differs is not None and "refuses these messages" in differs
    assert "one system message, first" in differs
    tokenizer.chat_template = CHATML_TEMPLATE
    assert chat_route_differs(chat, tokenizer, SYSTEM, ROLES) is None


@pytest.fixture(scope="module")
def export(notes_run, tmp_path_factory):
    out = tmp_path_factory.mktemp("chat_messages") / "export"
    assert main(["export", "--run", str(notes_run), "--out", str(out)]) == 0
    return out


def test_the_export_states_each_agents_view_as_chat_messages(export):
    team = json.loads((export / "team.json").read_text())
    chat = team["chat"]
    assert chat["route"] == "/v1/chat/completions"
    assert chat["renders_as_teamtr"] is True
    roles = [agent["role_prompt"] for agent in team["agents"]]
    assert [a["header"] for a in chat["agents"]] == roles
    assert [a["model"] for a in chat["agents"]] == ["agent0", "agent1"]
    assert [a["max_tokens"] for a in chat["agents"]] == [9, 5]
    second = chat["agents"][1]["first_view"]
    assert second == [
        {"role": "system", "content": team["system_prompt"]},
        {"role": "user", "content": "{question}"},
        {"role": "system", "content": roles[0]},
        {"role": "assistant", "content": "{message of speaker 0}"},
        {"role": "system", "content": "{note}\n" + roles[1]},
    ]
    assert chat["request"]["extra_body"]["stop_token_ids"] == [team["generation"]["stop_token_id"]]
    shipped = (export / "play_with_vllm.py").read_text()
    assert shipped.startswith('"""One greedy dialogue of a `teamtr export` folder')


def test_the_model_cards_view_code_builds_the_exports_messages(export):
    """The card's Python (everything between the client and the request) is run as written."""
    team = json.loads((export / "team.json").read_text())
    card = (export / "README.md").read_text()
    code = re.search(r"\n    HEADERS = .*?\n(?=    answer = )", card, re.S)
    assert code is not None
    namespace: dict = {}
    exec("\n".join(line[4:] for line in code[0].splitlines()), namespace)
    row = ROWS[1]
    notes = [row["note_a"], row["note_b"]]
    turns = [(0, "3 and"), (1, "4")]
    roles = [agent["role_prompt"] for agent in team["agents"]]
    for speaker in (0, 1):
        expected = view_messages(
            team["system_prompt"], roles, row["question"], notes, turns, speaker
        )
        assert namespace["view"](row["question"], notes, turns, speaker) == expected
    assert "renders these messages as teamtr renders its dialogues" in card


def test_chat_url_refuses_what_it_cannot_use_in_one_line(notes_run, capsys):
    chat = ["chat", "--run", str(notes_run), "--question", "What is 1 + 2?"]
    assert main([*chat, "--url", "ftp://127.0.0.1:1"]) == 2
    assert "--url: 'ftp://127.0.0.1:1' is not" in capsys.readouterr().err
    assert main([*chat, "--key-variable", "TEAMTR_TEST_KEY"]) == 2
    assert "--key-variable: only with --url" in capsys.readouterr().err
    unset = ["--url", "http://127.0.0.1:1", "--key-variable", "TEAMTR_UNSET_KEY_VARIABLE"]
    assert main([*chat, *unset]) == 2
    assert "environment has no TEAMTR_UNSET_KEY_VARIABLE" in capsys.readouterr().err
    # The real console script, so that its whole stderr is the one line (a library's warning
    # written to a stream it found at import would pass by pytest's capture).
    done = teamtr(*chat, "--url", f"http://127.0.0.1:{free_port()}")
    assert done.returncode == 2
    assert "no vLLM server answers there" in done.stderr
    assert len(done.stderr.strip().splitlines()) == 1
