"""Messages as actions: token factorisation and the chain rule of Lemma 3.1."""

from __future__ import annotations

import numpy as np
import pytest
from scipy.special import softmax

import sim
from sim.dialogue import TokenFactorisation


@pytest.mark.parametrize(("vocab", "length"), [(2, 3), (3, 2), (4, 3)])
def test_message_kl_equals_expected_per_token_kl_sum(vocab: int, length: int) -> None:
    tokens = TokenFactorisation(vocab, length)
    rng = np.random.default_rng(vocab * 10 + length)
    p = sim.message_probs_from_token_logits(
        rng.normal(size=(5, tokens.n_prefixes, vocab)), vocab, length
    )
    q = sim.message_probs_from_token_logits(
        rng.normal(size=(5, tokens.n_prefixes, vocab)), vocab, length
    )
    np.testing.assert_allclose(p.sum(axis=-1), 1.0, atol=1e-14)
    chain_rule = sim.per_token_kl_sum(p, q, vocab, length)
    np.testing.assert_allclose(tokens.message_kl(p, q), chain_rule, rtol=1e-12)
    assert np.all(chain_rule > 0)


def test_token_conditionals_invert_the_factorisation() -> None:
    tokens = TokenFactorisation(3, 3)
    logits = np.random.default_rng(0).normal(size=(tokens.n_prefixes, 3))
    messages = tokens.message_probs(logits)
    np.testing.assert_allclose(
        tokens.token_conditionals(messages), softmax(logits, axis=-1), atol=1e-14
    )
    np.testing.assert_allclose(tokens.prefix_probs(messages)[0], 1.0)


def test_message_indexing_round_trips() -> None:
    tokens = TokenFactorisation(3, 4)
    for index in (0, 5, 80):
        assert tokens.message_index(tokens.tokens(index)) == index
    assert tokens.tokens(5) == (0, 0, 1, 2)
    with pytest.raises(ValueError):
        tokens.message_index((0, 3, 0, 0))


def test_dialogue_mdp_structure_and_answer_reward() -> None:
    mdp = sim.dialogue_mdp(n_agents=2, vocab_size=2, message_length=2, n_turns=3, target=(1, 0))
    tokens = TokenFactorisation(2, 2)
    assert mdp.horizon == 3 and mdp.n_actions == 4 and mdp.n_states == 1 + 2 * 4 + 1
    # The speaker of turn t is agent t mod 2; the final state is absorbing.
    assert mdp.agent_of_state[0] == 0 and mdp.agent_of_state[1] == 1 and mdp.agent_of_state[5] == 0
    answer = tokens.message_index((1, 0))
    # Turn 2 after message (1, 0): answering (1, 0) agrees fully and hits the target.
    state = 1 + 4 + answer
    assert mdp.R[state, answer] == pytest.approx(1.0 + 0.2)
    # Optimal team: say the target at every turn.
    say_target = np.zeros((mdp.n_states, 4))
    say_target[:, answer] = 1.0
    assert sim.evaluate(mdp, say_target).J == pytest.approx(0.2 * 2 + 1.0)


def test_per_token_kl_of_the_dialogue_agents() -> None:
    """Reverse-KL updates of a dialogue agent are monitorable per token (Lemma 3.1)."""
    mdp = sim.dialogue_mdp(2, 2, 2, n_turns=3, seed=0)
    team = sim.random_team(mdp, 0)
    rollouts = sim.ExactSampler(mdp).sample(team)
    update = sim.ExactUpdater(mdp, "reverse").update(team, 1, rollouts, 0.02)
    tokens = TokenFactorisation(2, 2)
    mine = team.states_of(1)
    message_level = tokens.message_kl(update.policy[mine], team.table[mine])
    per_token = tokens.per_token_kl_sum(update.policy[mine], team.table[mine])
    np.testing.assert_allclose(message_level, per_token, rtol=1e-10, atol=1e-15)
    assert rollouts.occupancy[mine] @ per_token == pytest.approx(update.kl, rel=1e-9)
