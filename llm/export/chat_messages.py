"""An agent's view of a dialogue as the ``messages`` of a chat request (``/v1/chat/completions``).

teamtr renders a speaker's view as token ids (``llm.conversation.dialogue.ChatFormat``): the
chat template's rendering of ``[system: system prompt, user: question]``, then per turn the
speaker's header (its private note, in its own view only, and its role prompt, as one system
message, left out when both are empty; then the assistant generation prompt), its message and
the closing tokens. The same view as chat messages is

    [system: system prompt, user: question]
    + per turn so far, by speaker j: [system: header of j as the viewer sees it] + [assistant: message]
    + [system: the viewer's own header]

rendered by the server with ``add_generation_prompt`` (the default of a chat request). Where
the template renders each message on its own (ChatML, SmolLM2's), the two renderings are the
same text; where it does not (a template that writes a BOS or a default system prompt at the
start of every rendering, a date into each system message, or refuses a system message after
the first), they differ and only the completions route, token ids sent as teamtr renders them,
plays the team's dialogues. ``chat_route_differs`` tells which, on a sample dialogue.

The server re-tokenises the text of every earlier message: the chat route renders teamtr's
tokens where each message's text encodes back to the tokens sampled (``skip_special_tokens``
false keeps special tokens in that text; a message cut inside a multi-byte character does not
encode back). The completions route holds for every dialogue.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from transformers import PreTrainedTokenizerBase

from llm.conversation.dialogue import ChatFormat, Episode, Turn
from llm.problems.tasks import Problem

CHAT_ROUTE = "/v1/chat/completions"
SAMPLE_QUESTION = "What is 2 + 3?"
SAMPLE_MESSAGES = ("Five.", "It is 5", "The sum is 5.")
"""The messages of the sample dialogue the check renders: the middle one is cut before its stop
token (a message that reached its longest length), the others end with it."""
VIEW_RULE = (
    "messages = [system: system_prompt, user: question]; per turn so far, by speaker j: "
    "[system: header] (left out when empty) + [assistant: message text]; then [system: the "
    "speaker's own header] (left out when empty); the server adds the assistant generation "
    "prompt. header = note + '\\n' + role_prompt (either part left out when empty), where the "
    "note is speaker j's private note only in j's own view (j is the speaker the request is for)"
)


def header_text(role_prompts: Sequence[str], notes: Sequence[str], of: int, viewer: int) -> str:
    """The system message that opens speaker ``of``'s turns in ``viewer``'s view ("" for none):
    its note (only where ``of`` is the viewer) then its role prompt, as ``ChatFormat`` writes it."""
    note = notes[of] if of == viewer and of < len(notes) else ""
    role = role_prompts[of] if role_prompts else ""
    return "\n".join(part for part in (note, role) if part)


def view_messages(
    system_prompt: str,
    role_prompts: Sequence[str],
    question: str,
    notes: Sequence[str],
    turns: Sequence[tuple[int, str]],
    speaker: int,
) -> list[dict[str, str]]:
    """``speaker``'s view, before its turn, of a dialogue whose ``turns`` so far are (speaker,
    message text) pairs, as chat messages (the module's docstring)."""

    def header(of: int) -> list[dict[str, str]]:
        text = header_text(role_prompts, notes, of, speaker)
        return [{"role": "system", "content": text}] if text else []

    messages = [
        {"role": "system", "content": system_prompt},
        {"role": "user", "content": question},
    ]
    for of, text in turns:
        messages += [*header(of), {"role": "assistant", "content": text}]
    return [*messages, *header(speaker)]


def rendered_as_served(
    tokenizer: PreTrainedTokenizerBase, messages: list[dict[str, str]]
) -> list[int]:
    """The token ids a vLLM server prompts with for ``messages``: the chat template's text with
    the generation prompt, encoded without special tokens added (a chat request's default)."""
    text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    return list(tokenizer.encode(str(text), add_special_tokens=False))


def _sample_episode(
    chat: ChatFormat, tokenizer: PreTrainedTokenizerBase, notes: tuple[str, ...]
) -> Episode:
    """A dialogue of every speaker in turn (twice round for one speaker), with notes."""
    speakers = len(chat.headers)
    order = [t % speakers for t in range(max(speakers, len(SAMPLE_MESSAGES)))]
    turns = []
    for t, speaker in enumerate(order):
        ids = list(
            tokenizer.encode(SAMPLE_MESSAGES[t % len(SAMPLE_MESSAGES)], add_special_tokens=False)
        )
        ended = t % len(SAMPLE_MESSAGES) != 1
        turns.append(Turn(speaker, tuple(ids + [chat.stop_id] if ended else ids)))
    problem = Problem(SAMPLE_QUESTION, "", notes=notes)
    return Episode(problem, tuple(chat.encode_prompt(SAMPLE_QUESTION)), 0, tuple(turns))


def chat_route_differs(
    chat: ChatFormat,
    tokenizer: PreTrainedTokenizerBase,
    system_prompt: str,
    role_prompts: Sequence[str],
) -> str | None:
    """None where chat messages (``view_messages``) rendered as a server renders them
    (``rendered_as_served``) are token for token ``chat``'s own rendering of every speaker's
    view of a sample dialogue, before each of its turns, with private notes and without; else
    the first difference, in words."""
    speakers = len(chat.headers)
    for notes in (tuple(f"Your note is {k}." for k in range(speakers)), ()):
        episode = _sample_episode(chat, tokenizer, notes)
        for t in range(len(episode.turns) + 1):
            so_far = episode.with_turns(episode.turns[:t])
            for speaker in range(speakers):
                texts = [(turn.agent, _text(tokenizer, chat, turn)) for turn in so_far.turns]
                messages = view_messages(
                    system_prompt, role_prompts, SAMPLE_QUESTION, notes, texts, speaker
                )
                try:
                    served = rendered_as_served(tokenizer, messages)
                except Exception as error:  # the template's own code refusing the messages
                    return (
                        f"speaker {speaker}'s view before turn {t + 1}: the chat template "
                        f"refuses these messages ({type(error).__name__}: {error})"
                    )
                own = chat.context(so_far, speaker)
                if served != own:
                    return _first_difference(tokenizer, own, served, speaker, t, bool(notes))
    return None


def _text(tokenizer: PreTrainedTokenizerBase, chat: ChatFormat, turn: Turn) -> str:
    """A message's text as the server returns it: its stop token left out, special tokens kept."""
    ids = list(turn.message)
    if ids and ids[-1] == chat.stop_id:
        ids = ids[:-1]
    return str(tokenizer.decode(ids, skip_special_tokens=False))


def _first_difference(
    tokenizer: PreTrainedTokenizerBase,
    own: list[int],
    served: list[int],
    speaker: int,
    turn: int,
    with_notes: bool,
) -> str:
    at = next((i for i, (a, b) in enumerate(zip(own, served, strict=False)) if a != b), None)
    at = min(len(own), len(served)) if at is None else at
    notes = "with notes" if with_notes else "without notes"
    return (
        f"speaker {speaker}'s view before turn {turn + 1} ({notes}): the chat template renders "
        f"{tokenizer.decode(served[at : at + 12])!r} at token {at}, teamtr "
        f"{tokenizer.decode(own[at : at + 12])!r}"
    )


def chat_description(
    chat: ChatFormat,
    tokenizer: PreTrainedTokenizerBase,
    system_prompt: str,
    role_prompts: Sequence[str],
    agents: Sequence[dict[str, Any]],
    speaking_order: Sequence[int],
) -> dict[str, Any]:
    """``team.json``'s ``"chat"``: whether and how a chat request plays each agent's turns;
    ``agents`` is team.json's own list (each speaker's adapter and longest message)."""
    differs = chat_route_differs(chat, tokenizer, system_prompt, role_prompts)
    placeholders = ["{note}"] * len(agents)
    views = []
    for agent in agents:
        k = agent["speaker"]
        first = list(speaking_order).index(k) if k in speaking_order else 0
        before = [(j, f"{{message of speaker {j}}}") for j in list(speaking_order)[:first]]
        messages = view_messages(system_prompt, role_prompts, "{question}", placeholders, before, k)
        views.append(
            {
                "speaker": k,
                "model": agent["adapter"],
                "max_tokens": agent["max_new_tokens"],
                "header": header_text(role_prompts, (), k, k),
                "header_with_note": header_text(role_prompts, placeholders, k, k),
                "first_view": messages,
            }
        )
    exact = (
        "rendered by the tokenizer's chat template, every speaker's view of a sample dialogue "
        "is teamtr's token for token, with notes and without"
    )
    return {
        "route": CHAT_ROUTE,
        "renders_as_teamtr": differs is None,
        "checked": exact if differs is None else f"it is not: {differs}",
        "view": VIEW_RULE,
        "agents": views,
        "request": {
            "temperature": 0,
            "extra_body": {
                # What the vLLM engine asks for: the message ends at the chat's stop token,
                # and its text keeps special tokens, so that it renders back to its tokens.
                "stop_token_ids": [chat.stop_id],
                "ignore_eos": True,
                "skip_special_tokens": False,
            },
        },
        "exact_where": (
            "each earlier message's text (as the server returns it) encodes back to the tokens "
            "sampled; the completions route (play_with_vllm.py: token ids as teamtr renders "
            "them) holds for every dialogue"
            + ("" if differs is None else " and is the route for this base model")
        ),
    }


def chat_card(team: dict[str, Any]) -> str:
    """The model card's section on calling the served team with any OpenAI client."""
    chat = team["chat"]
    headers = [agent["header"] for agent in chat["agents"]]
    first = chat["agents"][0]
    extra = repr(chat["request"]["extra_body"])  # Python, not JSON: True, not true
    card = f"""Call it with any OpenAI client (`{chat["route"]}`, team.json's "chat"): an agent's
view of the dialogue so far is the messages

    [system: the system prompt, user: the question]
    + per turn so far, by speaker j: [system: j's header] + [assistant: j's message]
    + [system: the agent's own header]

where speaker k's header is its role prompt ({headers!r}), after its private note (a line of
its own) in its own view only, and a header that is empty is left out:

    import os
    from openai import OpenAI

    client = OpenAI(base_url="http://127.0.0.1:8000/v1", api_key=os.environ["VLLM_API_KEY"])
    HEADERS = {headers!r}

    def view(question, notes, turns, speaker):  # turns so far: [(speaker, text), ...]
        def header(j):
            note = notes[j] if notes and j == speaker else ""
            text = "\\n".join(part for part in (note, HEADERS[j]) if part)
            return [{{"role": "system", "content": text}}] if text else []

        messages = [{{"role": "system", "content": {team["system_prompt"]!r}}},
                    {{"role": "user", "content": question}}]
        for j, text in turns:
            messages += header(j) + [{{"role": "assistant", "content": text}}]
        return messages + header(speaker)

    answer = client.chat.completions.create(
        model="{first["model"]}", messages=view("...", [], [], {first["speaker"]}),
        max_tokens={first["max_tokens"]},  # its longest message (team.json: each agent's)
        temperature=0,  # greedy, as teamtr chat plays
        extra_body={extra},
    )
    text = answer.choices[0].message.content
"""
    if chat["renders_as_teamtr"]:
        return card + (
            f"\nThe server renders these messages as teamtr renders its dialogues ({chat['checked']})"
            f", where {chat['exact_where']}.\n"
        )
    return card + (
        "\nThis base model's chat template does not render these messages as teamtr renders its"
        f" dialogues ({chat['checked']}): play the team through `play_with_vllm.py` (the"
        " completions route) or `teamtr chat --url`.\n"
    )
