"""Seeded instance builders shared by the hypothesis strategies and ``teamtr verify``.

Everything here is plain numpy (no hypothesis), so ``teamtr verify`` runs without the test
extras. ``proofs_check.strategies`` draws the parameters with hypothesis and calls these same
builders; ``proofs_check.checks`` calls them with parameters drawn from a seeded generator.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import numpy as np
from numpy.typing import NDArray

from teamtr.divergence import kl, kl_in_direction, log_softmax

FloatArray = NDArray[np.float64]
IntArray = NDArray[np.int64]
Direction = Literal["reverse", "forward"]


# --- distributions and policy tables -------------------------------------------------------


def softmax_rows(logits: FloatArray) -> FloatArray:
    """Row-wise softmax of a logit table (last axis)."""
    out: FloatArray = np.exp(log_softmax(logits))
    return out


def random_policy_table(
    rng: np.random.Generator, n_rows: int, n_actions: int, logit_scale: float
) -> FloatArray:
    """Rows softmax(logit_scale * N(0, 1)): near-uniform for small scales, near-deterministic
    (one action with almost all the mass) for scales around 10 and above."""
    return softmax_rows(logit_scale * rng.standard_normal((n_rows, n_actions)))


def tilt(table: FloatArray, direction: FloatArray, step: float) -> FloatArray:
    """The exponential tilt softmax(log table + step * direction), row-wise.

    Along ``step`` both KL(tilted || table) and KL(table || tilted) grow monotonically from 0,
    which is what lets :func:`perturb_within_radius` hit a radius by bisection.
    """
    with np.errstate(divide="ignore"):
        logits = np.log(table) + step * direction
    return softmax_rows(logits)


def perturb_within_radius(
    table: FloatArray,
    rows: NDArray[np.bool_],
    weights: FloatArray,
    radius: float,
    direction: Direction,
    rng: np.random.Generator,
) -> FloatArray:
    """A random trust-region update of the rows ``rows`` of ``table``.

    Draws a random logit direction g on those rows and returns the tilt by the step whose
    weighted mean KL (in ``direction``; weights = an occupancy) equals ``radius`` (or the
    largest step tried, 64, if even that stays inside). Rows outside ``rows`` are untouched.
    """
    g = np.where(rows[:, None], rng.standard_normal(table.shape), 0.0)
    total = float(np.sum(weights))

    def mean_kl(step: float) -> float:
        per_state = kl_in_direction(tilt(table, g, step), table, direction)
        return float(np.sum(np.where(weights > 0, weights * per_state, 0.0)) / total)

    lo, hi = 0.0, 64.0
    if total <= 0 or mean_kl(hi) <= radius:
        return tilt(table, g, hi)
    for _ in range(60):
        mid = 0.5 * (lo + hi)
        if mean_kl(mid) <= radius:
            lo = mid
        else:
            hi = mid
    return tilt(table, g, lo)


# --- token-by-token message policies (Lemma 3.1, token level) ------------------------------


@dataclass(frozen=True)
class MessagePair:
    """Two autoregressive message policies p and q over V tokens and messages of length T.

    ``logits_p[t]`` has shape (V**t, V): row j holds the next-token logits after the prefix
    whose base-V digits are j (most significant first). Same for ``logits_q``.
    """

    vocab_size: int
    length: int
    logits_p: tuple[FloatArray, ...]
    logits_q: tuple[FloatArray, ...]


def random_message_pair(
    rng: np.random.Generator,
    vocab_size: int,
    length: int,
    logit_scale: float,
    closeness: float,
) -> MessagePair:
    """p with logits logit_scale * N(0,1) per prefix; q = p's logits + closeness * N(0,1)."""
    logits_p = tuple(
        logit_scale * rng.standard_normal((vocab_size**t, vocab_size)) for t in range(length)
    )
    logits_q = tuple(lp + closeness * rng.standard_normal(lp.shape) for lp in logits_p)
    return MessagePair(vocab_size, length, logits_p, logits_q)


def all_messages(vocab_size: int, length: int) -> IntArray:
    """Every message, shape (V**T, T), in lexicographic order."""
    grids = np.indices((vocab_size,) * length).reshape(length, -1).T
    out: IntArray = grids.astype(np.int64)
    return out


def prefix_indices(messages: IntArray, vocab_size: int) -> IntArray:
    """Row index of every prefix y_<t into ``logits[t]``, shape (M, T)."""
    m, length = messages.shape
    idx = np.zeros((m, length), dtype=np.int64)
    for t in range(1, length):
        idx[:, t] = idx[:, t - 1] * vocab_size + messages[:, t - 1]
    return idx


def token_logits_along(logits: tuple[FloatArray, ...], messages: IntArray, vocab_size: int):
    """The next-token logits at every position of every message, shape (M, T, V)."""
    idx = prefix_indices(messages, vocab_size)
    return np.stack([logits[t][idx[:, t]] for t in range(messages.shape[1])], axis=1)


def token_log_probs(logits_along: FloatArray, messages: IntArray) -> FloatArray:
    """log p(y_t | y_<t) at every position, shape (M, T)."""
    logp = log_softmax(logits_along)
    out: FloatArray = np.take_along_axis(logp, messages[..., None], axis=-1)[..., 0]
    return out


def sample_messages(
    rng: np.random.Generator, logits: tuple[FloatArray, ...], vocab_size: int, n: int
) -> IntArray:
    """n messages drawn token by token from the policy with these logits."""
    length = len(logits)
    messages = np.zeros((n, length), dtype=np.int64)
    prefix = np.zeros(n, dtype=np.int64)
    for t in range(length):
        probs = softmax_rows(logits[t][prefix])
        u = rng.random(n)[:, None]
        tokens = np.minimum((np.cumsum(probs, axis=1) < u).sum(axis=1), vocab_size - 1)
        messages[:, t] = tokens
        prefix = prefix * vocab_size + tokens
    return messages


# --- turn-taking MDPs as raw arrays ---------------------------------------------------------


@dataclass(frozen=True)
class TabularMDP:
    """A turn-taking MDP as dense arrays (THEORY.md §1): the form the exact oracle reads.

    ``P`` is S x A x S, ``R`` is S x A, ``agent_of_state[s]`` is the agent acting in s.
    ``horizon`` is None for the discounted setting, else H with ``gamma == 1`` (episodic).
    """

    P: FloatArray
    R: FloatArray
    rho0: FloatArray
    gamma: float
    agent_of_state: IntArray
    horizon: int | None = None

    @property
    def n_states(self) -> int:
        return int(self.P.shape[0])

    @property
    def n_actions(self) -> int:
        return int(self.P.shape[1])

    @property
    def n_agents(self) -> int:
        return int(self.agent_of_state.max()) + 1

    @property
    def r_max(self) -> float:
        return float(np.max(np.abs(self.R)))


def random_agent_assignment(rng: np.random.Generator, n_states: int, n_agents: int) -> IntArray:
    """Every agent acts in at least one state; the other states get uniform random agents."""
    if not 1 <= n_agents <= n_states:
        raise ValueError(f"need 1 <= n_agents <= n_states, got {n_agents} and {n_states}")
    ids = np.concatenate([np.arange(n_agents), rng.integers(0, n_agents, n_states - n_agents)])
    out: IntArray = rng.permutation(ids).astype(np.int64)
    return out


def random_tabular_mdp(
    rng: np.random.Generator,
    n_states: int,
    n_actions: int,
    n_agents: int,
    gamma: float,
    horizon: int | None = None,
    branching: int | None = None,
    reward_density: float = 1.0,
) -> TabularMDP:
    """A random turn-taking MDP.

    ``branching`` = number of successor states per (s, a) (sparse transitions), None = dense
    Dirichlet rows. ``reward_density`` is the fraction of (s, a) pairs with a nonzero reward
    in [-1, 1] (sparse rewards for values below 1). ``horizon`` makes it episodic (gamma = 1).
    """
    P = np.zeros((n_states, n_actions, n_states))
    if branching is None or branching >= n_states:
        P[:] = rng.dirichlet(np.ones(n_states), size=(n_states, n_actions))
    else:
        for s in range(n_states):
            for a in range(n_actions):
                successors = rng.choice(n_states, size=branching, replace=False)
                P[s, a, successors] = rng.dirichlet(np.ones(branching))
    R = rng.uniform(-1.0, 1.0, (n_states, n_actions))
    R *= rng.random((n_states, n_actions)) < reward_density
    if not np.any(R):
        R[rng.integers(n_states), rng.integers(n_actions)] = 1.0
    rho0 = rng.dirichlet(np.ones(n_states))
    return TabularMDP(
        P=P,
        R=R,
        rho0=rho0,
        gamma=1.0 if horizon is not None else float(gamma),
        agent_of_state=random_agent_assignment(rng, n_states, n_agents),
        horizon=horizon,
    )


def draw_tabular_mdp(
    rng: np.random.Generator,
    episodic: bool = False,
    max_states: int = 16,
    max_agents: int = 8,
    min_agents: int = 1,
    min_horizon: int = 1,
) -> TabularMDP:
    """A random small instance with randomly drawn sizes (what ``teamtr verify`` uses)."""
    n_states = int(rng.integers(max(2, min_agents), max_states + 1))
    n_agents = int(rng.integers(min_agents, min(max_agents, n_states) + 1))
    n_actions = int(rng.integers(2, 5))
    branching = None if rng.random() < 0.5 else int(rng.integers(1, 4))
    density = 1.0 if rng.random() < 0.7 else float(rng.uniform(0.05, 0.5))
    if episodic:
        return random_tabular_mdp(
            rng,
            n_states,
            n_actions,
            n_agents,
            1.0,
            int(rng.integers(min_horizon, 7)),
            branching,
            density,
        )
    gamma = float(rng.choice([0.0, 0.5, 0.9, 0.95])) if rng.random() < 0.3 else rng.uniform(0, 0.95)
    return random_tabular_mdp(rng, n_states, n_actions, n_agents, gamma, None, branching, density)


def draw_team(rng: np.random.Generator, mdp: TabularMDP) -> FloatArray:
    """A team table; a quarter of the draws are near-deterministic (logit scale 8 to 14)."""
    scale = rng.uniform(8.0, 14.0) if rng.random() < 0.25 else rng.uniform(0.1, 3.0)
    return random_policy_table(rng, mdp.n_states, mdp.n_actions, scale)


def draw_radius(rng: np.random.Generator) -> float:
    """delta_i, log-uniform in [1e-4, 0.5]."""
    return float(np.exp(rng.uniform(np.log(1e-4), np.log(0.5))))


# --- seeded instances of the checks of ``teamtr verify`` ------------------------------------


def draw_stage0(rng: np.random.Generator) -> tuple[FloatArray, FloatArray, float]:
    """pi_pre, pi_cur (a few states, near-deterministic at times) and a radius delta0."""
    n_states, n_actions = int(rng.integers(1, 4)), int(rng.integers(2, 6))
    pre = random_policy_table(rng, n_states, n_actions, float(rng.uniform(0.3, 4.0)))
    cur = random_policy_table(rng, n_states, n_actions, float(rng.uniform(0.3, 4.0)))
    radius = float(rng.uniform(0.05, 1.2)) * float(np.mean(kl(pre, cur)))
    return pre, cur, max(radius, 1e-4)


def draw_message_pair(rng: np.random.Generator) -> MessagePair:
    """A small pair of token-by-token message policies (V <= 4, T <= 3)."""
    return random_message_pair(
        rng,
        vocab_size=int(rng.integers(2, 5)),
        length=int(rng.integers(1, 4)),
        logit_scale=float(rng.uniform(0.2, 3.0)),
        closeness=float(rng.uniform(0.05, 1.0)),
    )
