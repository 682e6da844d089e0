"""Teams are values over one backbone; the loader fails with a typed, explanatory error."""

from __future__ import annotations

import pytest
import torch
from llm_test_support import logit_resolution, perturb_agent

from llm.logprobs.scoring import message_logits
from llm.models.loading import ModelNotAvailableError, load_model, resolve_source, smollm2_directory


def test_with_agent_returns_a_new_team_and_activation_swaps_weights(char_team):
    changed = perturb_agent(char_team, 1, 0.1, seed=0)
    assert changed is not char_team and char_team.agent(1) is not changed.agent(1)
    assert changed.agent(0) is char_team.agent(0)
    assert changed.differing_agents(char_team) == (1,)
    changed.activate()
    live = char_team.backbone.parameters_of(1)
    assert all(torch.equal(live[k], changed.agent(1).tensors[k]) for k in live)
    char_team.activate()
    assert all(torch.equal(live[k], char_team.agent(1).tensors[k]) for k in live)


def test_only_the_speaker_adapter_is_active(char_team, char_chat):
    from llm.conversation.dialogue import Episode, Turn
    from llm.problems.tasks import Problem

    episode = Episode(
        Problem("What is 1 + 1?", "2"),
        tuple(char_chat.encode_prompt("1+1")),
        0,
        (Turn(0, (20, 21)), Turn(1, (22, 23, 2))),
    )
    team = perturb_agent(char_team, 1, 0.5, seed=1)

    def agent1_logits(team_):
        batch = message_logits(team_.use(1), char_chat, [episode], 1, [0])
        return batch.logits

    with torch.no_grad():
        base = agent1_logits(char_team)
        moved = agent1_logits(team)
        agent0_changed = perturb_agent(team, 0, 0.5, seed=2)
        unaffected = agent1_logits(agent0_changed)
    assert not torch.allclose(base, moved)
    assert torch.equal(moved, unaffected)  # agent 0's adapter plays no part in agent 1's turn


def test_message_positions_are_the_agents_own_tokens(char_team, char_chat):
    from llm.conversation.dialogue import Episode, Turn
    from llm.problems.tasks import Problem

    turns = (Turn(0, (20, 21, 2)), Turn(1, (30, 31)), Turn(2, (40,)), Turn(1, (50, 51, 2)))
    episode = Episode(Problem("q", "1"), tuple(char_chat.encode_prompt("q")), 0, turns)
    model = char_team.use(1)
    with torch.no_grad():
        batch = message_logits(model, char_chat, [episode], 1, [0])
        ids, spans = char_chat.assemble(episode)
        full = model(input_ids=torch.tensor([ids])).logits[0]
    assert batch.refs == ((0, 1), (0, 3))
    assert batch.tokens[batch.mask].tolist() == [30, 31, 50, 51, 2]
    # One forward pass over the whole transcript against the rows of the batched one: the same
    # sums in other batch shapes, so the same logits up to float32 rounding (the premise of
    # logit_resolution, logits below 1, is checked). Over these transcripts (84 to 97 positions)
    # it allows 9e-5, looser than the former atol = rtol = 1e-5; measured: 6e-8 natively on
    # AVX-512, 0 with ATEN_CPU_CAPABILITY=default or avx2.
    assert full.abs().max() < 1
    tolerance = logit_resolution(model.config, len(ids))
    for row, (_, t) in enumerate(batch.refs):
        start, end = spans[t]
        assert ids[start:end] == list(turns[t].message)
        n = end - start
        torch.testing.assert_close(
            batch.logits[row, :n], full[start - 1 : end - 1], atol=tolerance, rtol=0
        )


def test_rows_stop_at_the_agents_last_message_without_changing_its_logits(char_team, char_chat):
    """The first speaker's rows are scored without the rest of the dialogue (causal attention)."""
    from llm.conversation.dialogue import Episode, Turn
    from llm.problems.tasks import Problem

    prompt = tuple(char_chat.encode_prompt("q"))
    long_tail = (Turn(0, (20, 21, 2)), Turn(1, tuple(range(30, 60))), Turn(2, (40, 2)))
    short = (Turn(0, (22, 23, 24, 2)), Turn(1, (31,)), Turn(2, (41,)))
    episodes = [Episode(Problem("q", "1"), prompt, 0, turns) for turns in (long_tail, short)]
    model = char_team.use(0)
    longest = max(len(char_chat.assemble(episode)[0]) for episode in episodes)
    tolerance = logit_resolution(model.config, longest)  # as in the test above
    with torch.no_grad():
        batch = message_logits(model, char_chat, episodes, 0, [0, 1])
        for row, episode in enumerate(episodes):
            ids, spans = char_chat.assemble(episode)
            full = model(input_ids=torch.tensor([ids])).logits[0]
            assert full.abs().max() < 1
            start, end = spans[0]
            torch.testing.assert_close(
                batch.logits[row, : end - start], full[start - 1 : end - 1], atol=tolerance, rtol=0
            )


def test_loader_errors_are_typed_and_name_the_source(tmp_path):
    with pytest.raises(ModelNotAvailableError, match="no such file"):
        resolve_source(str(tmp_path / "missing.gguf"))
    with pytest.raises(ModelNotAvailableError, match="no config.json"):
        resolve_source(str(tmp_path))
    with pytest.raises(ModelNotAvailableError, match="nobody/not-a-cached-model"):
        load_model("nobody/not-a-cached-model")
    assert resolve_source("tiny").location == "tiny"
    if smollm2_directory() is not None:
        resolved = resolve_source("smollm2")
        assert resolved.gguf_file and resolved.gguf_file.endswith(".gguf")
