"""A small dialogue MDP whose actions are whole messages, and their token factorisation.

This is the bridge to the language-model backend (THEORY.md §2, Lemma 3.1): an agent's action
is a message y = (y_1 .. y_T) over a vocabulary of V tokens, action index = the message read
as a base-V number (y_1 most significant). A message policy p(y|s) factors into per-token
conditionals p(y_t | s, y_<t); the chain rule

    KL(p(.|s) || q(.|s)) = E_{y ~ p}[ sum_t KL(p(.|s, y_<t) || q(.|s, y_<t)) ]

is checked here by enumeration: ``TokenFactorisation.message_kl`` sums over all V^T messages,
``TokenFactorisation.per_token_kl_sum`` sums per-token KLs over all prefixes weighted by their
probability under p.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

import numpy as np
import scipy.sparse as sp
from numpy.typing import NDArray
from scipy.special import log_softmax

from sim.mdp import TurnTakingMDP

Array = NDArray[np.float64]


@dataclass(frozen=True)
class TokenFactorisation:
    """Messages of ``length`` tokens over ``vocab_size`` tokens, and their prefixes.

    Prefixes of length j < T are numbered after all shorter ones: prefix id =
    (V^j - 1)/(V - 1) + (prefix read as a base-V number); there are sum_{j<T} V^j of them.
    Token-level arrays have shape (..., n_prefixes, V): row ``prefix`` holds p(. | prefix).
    """

    vocab_size: int
    length: int

    def __post_init__(self) -> None:
        if self.vocab_size < 1 or self.length < 1:
            raise ValueError(
                f"vocab_size and length must be >= 1, got {self.vocab_size}, {self.length}"
            )

    @property
    def n_messages(self) -> int:
        return int(self.vocab_size**self.length)

    @property
    def n_prefixes(self) -> int:
        return int(sum(self.vocab_size**j for j in range(self.length)))

    def prefix_offset(self, prefix_length: int) -> int:
        return int(sum(self.vocab_size**j for j in range(prefix_length)))

    def tokens(self, message: int) -> tuple[int, ...]:
        """The tokens of message ``message`` (first token most significant)."""
        return tuple(int(t) for t in self.message_tokens[message])

    def message_index(self, tokens: tuple[int, ...] | list[int]) -> int:
        if len(tokens) != self.length or not all(0 <= t < self.vocab_size for t in tokens):
            raise ValueError(
                f"expected {self.length} tokens in [0, {self.vocab_size}), got {tokens}"
            )
        index = 0
        for token in tokens:
            index = index * self.vocab_size + int(token)
        return index

    @cached_property
    def message_tokens(self) -> NDArray[np.int64]:
        """n_messages x T array of every message's tokens."""
        messages = np.arange(self.n_messages)
        powers = self.vocab_size ** np.arange(self.length - 1, -1, -1)
        return (messages[:, None] // powers[None, :]) % self.vocab_size

    @cached_property
    def message_prefixes(self) -> NDArray[np.int64]:
        """n_messages x T array: the prefix id before each token of each message."""
        ids = np.empty((self.n_messages, self.length), dtype=np.int64)
        value = np.zeros(self.n_messages, dtype=np.int64)
        for j in range(self.length):
            ids[:, j] = self.prefix_offset(j) + value
            value = value * self.vocab_size + self.message_tokens[:, j]
        return ids

    def message_log_probs(self, token_log_probs: Array) -> Array:
        """log p(y) = sum_t log p(y_t | y_<t) for every message; input (..., n_prefixes, V)."""
        per_token = token_log_probs[..., self.message_prefixes, self.message_tokens]
        return np.asarray(per_token.sum(axis=-1))

    def message_probs(self, token_logits: Array) -> Array:
        """p(y) for every message from per-prefix token logits (..., n_prefixes, V)."""
        return np.exp(self.message_log_probs(log_softmax(token_logits, axis=-1)))

    def prefix_probs(self, message_probs: Array) -> Array:
        """P(prefix) for every prefix id: the mass of the messages that start with it."""
        batch = message_probs.shape[:-1]
        blocks = []
        for j in range(self.length):
            grouped = message_probs.reshape(*batch, self.vocab_size**j, -1)
            blocks.append(grouped.sum(axis=-1))
        return np.concatenate(blocks, axis=-1)

    def token_conditionals(self, message_probs: Array) -> Array:
        """p(. | prefix) for every prefix (..., n_prefixes, V); uniform where P(prefix) = 0."""
        batch = message_probs.shape[:-1]
        blocks = []
        for j in range(self.length):
            extended = message_probs.reshape(*batch, self.vocab_size**j, self.vocab_size, -1)
            mass = extended.sum(axis=-1)
            total = mass.sum(axis=-1, keepdims=True)
            with np.errstate(invalid="ignore", divide="ignore"):
                blocks.append(np.where(total > 0, mass / total, 1.0 / self.vocab_size))
        return np.concatenate(blocks, axis=-2)

    def message_kl(self, p: Array, q: Array) -> Array:
        """KL(p || q) over messages, by enumeration of all V^T messages."""
        with np.errstate(divide="ignore", invalid="ignore"):
            terms = np.where(p > 0, p * (np.log(p) - np.log(q)), 0.0)
        return np.asarray(terms.sum(axis=-1))

    def per_token_kl_sum(self, p: Array, q: Array) -> Array:
        """E_{y~p}[sum_t KL(p(.|y_<t) || q(.|y_<t))], by enumeration of the prefixes."""
        p_tokens = self.token_conditionals(p)
        q_tokens = self.token_conditionals(q)
        with np.errstate(divide="ignore", invalid="ignore"):
            terms = np.where(p_tokens > 0, p_tokens * (np.log(p_tokens) - np.log(q_tokens)), 0.0)
        per_prefix = terms.sum(axis=-1)
        return np.asarray((self.prefix_probs(p) * per_prefix).sum(axis=-1))


def message_probs_from_token_logits(
    token_logits: Array, vocab_size: int, message_length: int
) -> Array:
    """p(y) for all V^T messages from per-prefix token logits of shape (..., n_prefixes, V)."""
    return TokenFactorisation(vocab_size, message_length).message_probs(token_logits)


def per_token_kl_sum(p: Array, q: Array, vocab_size: int, message_length: int) -> Array:
    """The chain-rule side of Lemma 3.1 for message distributions p, q (..., V^T)."""
    return TokenFactorisation(vocab_size, message_length).per_token_kl_sum(p, q)


def dialogue_mdp(
    n_agents: int = 2,
    vocab_size: int = 3,
    message_length: int = 2,
    n_turns: int | None = None,
    seed: int | np.random.Generator | None = 0,
    relevance_weight: float = 0.2,
    target: tuple[int, ...] | None = None,
) -> TurnTakingMDP:
    """A shared transcript of ``n_turns`` messages; the speaker of turn t is agent t mod n.

    State = (turn t, previous message): state 0 is the prompt (t = 0), state
    1 + (t - 1) * V^T + m is turn t after message m, and the last state ends the dialogue
    (absorbing, reward 0). Action = the whole message (``TokenFactorisation`` indexing).
    Every reply earns ``relevance_weight`` * (fraction of positions agreeing with the previous
    message); the final answer (turn n_turns - 1) also earns the fraction of positions equal to
    a hidden ``target`` (random from ``seed`` unless given). Episodic with horizon n_turns and
    gamma = 1: the reward is on the answer, as in the language-model case.
    """
    factorisation = TokenFactorisation(vocab_size, message_length)
    turns = n_agents + 1 if n_turns is None else n_turns
    if turns < 1:
        raise ValueError(f"n_turns must be >= 1, got {turns}")
    rng = np.random.default_rng(seed)
    goal = (
        np.asarray(target)
        if target is not None
        else rng.integers(0, vocab_size, size=message_length)
    )
    if goal.shape != (message_length,):
        raise ValueError(f"target must have {message_length} tokens, got {goal.tolist()}")
    n_messages = factorisation.n_messages
    tokens = factorisation.message_tokens
    n_states = 1 + (turns - 1) * n_messages + 1
    done = n_states - 1

    turn_of_state = np.concatenate(([0], np.repeat(np.arange(1, turns), n_messages), [turns]))
    previous = np.concatenate(([-1], np.tile(np.arange(n_messages), turns - 1), [-1]))
    agents = np.where(turn_of_state < turns, turn_of_state % n_agents, 0)

    agreement = (tokens[:, None, :] == tokens[None, :, :]).mean(axis=2)  # [previous, reply]
    answer_score = (tokens == goal[None, :]).mean(axis=1)
    rewards = np.zeros((n_states, n_messages))
    talking = np.flatnonzero((turn_of_state >= 1) & (turn_of_state < turns))
    rewards[talking] = relevance_weight * agreement[previous[talking]]
    final_turn = np.flatnonzero(turn_of_state == turns - 1)
    rewards[final_turn] += answer_score[None, :]

    turn_block = 1 + turn_of_state * n_messages  # the first state of the following turn
    next_state = np.where(
        (turn_of_state + 1 < turns)[:, None],
        turn_block[:, None] + np.arange(n_messages)[None, :],
        done,
    )
    # Deterministic transitions: one stored probability per (state, message) row.
    P = sp.csr_matrix(
        (np.ones(n_states * n_messages), next_state.ravel(), np.arange(n_states * n_messages + 1)),
        shape=(n_states * n_messages, n_states),
    )
    start = np.zeros(n_states)
    start[0] = 1.0
    return TurnTakingMDP(P, rewards, start, 1.0, agents, turns, n_agents=n_agents)
