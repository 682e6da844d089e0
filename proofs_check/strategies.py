"""Hypothesis strategies for the property tests of THEORY.md §2 (library code).

Sizes, discounts, horizons, sparsity, temperatures, agents and orders are drawn by hypothesis
(so it can shrink them); the arrays themselves come from the seeded numpy builders of
``proofs_check.instances`` with a drawn seed, so every instance is reproducible from its
printed draw. Instances stay small (<= 12 states, <= 4 actions, <= 8 agents, H <= 6) so that
exact evaluation is instant.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from hypothesis import strategies as st

from proofs_check.instances import (
    Direction,
    MessagePair,
    TabularMDP,
    perturb_within_radius,
    random_message_pair,
    random_policy_table,
    random_tabular_mdp,
    tilt,
)
from proofs_check.traces import Trace, random_proposal, stage_trace

seeds = st.integers(min_value=0, max_value=2**32 - 1)
"""Seeds of the numpy generators that fill an instance's arrays."""

discounts = st.one_of(
    st.sampled_from([0.0, 0.5, 0.9, 0.95]),
    st.floats(min_value=0.0, max_value=0.95, allow_nan=False, allow_subnormal=False),
)
"""gamma in [0, 0.95], with the edge values drawn often. Subnormal gamma (< 2.2e-308) is left
out: it gives advantage spreads of ~1e-308 on which ``sim.ExactUpdater``'s temperature search
overflows to NaN and raises (reported; gamma = 0 and gamma = 1e-300 are fine)."""

radii = st.floats(min_value=1e-4, max_value=0.5, allow_nan=False)
"""delta_i, the per-agent KL radius."""

directions: st.SearchStrategy[Direction] = st.sampled_from(["reverse", "forward"])
"""Which KL a trust region constrains: KL(new || old) or KL(old || new)."""


@st.composite
def tabular_mdps(
    draw: st.DrawFn,
    episodic: bool | None = False,
    min_states: int = 1,
    max_states: int = 12,
    min_agents: int = 1,
    max_agents: int = 8,
    max_actions: int = 4,
    min_horizon: int = 1,
    max_horizon: int = 6,
    sparse: bool | None = None,
) -> TabularMDP:
    """Turn-taking MDPs as dense arrays (the oracle's form).

    ``episodic``: False = discounted, True = episodic (gamma = 1, horizon H), None = either.
    ``sparse``: True = each (s, a) has 1-3 successors, False = dense rows, None = either;
    rewards are dense or sparse (5-50% of the pairs) at random.
    """
    n_states = draw(st.integers(max(min_states, min_agents), max_states))
    n_agents = draw(st.integers(min_agents, min(max_agents, n_states)))
    n_actions = draw(st.integers(1, max_actions))
    is_episodic = draw(st.booleans()) if episodic is None else episodic
    use_sparse = draw(st.booleans()) if sparse is None else sparse
    branching = draw(st.integers(1, 3)) if use_sparse else None
    density = draw(st.one_of(st.just(1.0), st.floats(0.05, 0.5)))
    horizon = draw(st.integers(min_horizon, max_horizon)) if is_episodic else None
    gamma = 1.0 if is_episodic else draw(discounts)
    rng = np.random.default_rng(draw(seeds))
    return random_tabular_mdp(
        rng, n_states, n_actions, n_agents, gamma, horizon, branching, density
    )


@st.composite
def turn_taking_mdps(draw: st.DrawFn, **kwargs: object):
    """``sim.TurnTakingMDP`` objects, with P passed dense (S x A x S) or sparse ((S*A) x S)."""
    from proofs_check.traces import to_sim

    mdp = draw(tabular_mdps(**kwargs))  # type: ignore[arg-type]
    return to_sim(mdp, sparse=draw(st.booleans()))


logit_scales = st.one_of(
    st.floats(min_value=0.0, max_value=3.0),
    st.floats(min_value=8.0, max_value=14.0),
)
"""Softmax temperatures of team tables: near-uniform to moderate, or near-deterministic."""


@st.composite
def team_tables(
    draw: st.DrawFn, mdp: TabularMDP, near_deterministic: bool | None = None
) -> np.ndarray:
    """A team table pi (S x A); ``near_deterministic`` forces logit scales of 8 to 14."""
    if near_deterministic is None:
        scale = draw(logit_scales)
    elif near_deterministic:
        scale = draw(st.floats(min_value=8.0, max_value=14.0))
    else:
        scale = draw(st.floats(min_value=0.0, max_value=3.0))
    rng = np.random.default_rng(draw(seeds))
    return random_policy_table(rng, mdp.n_states, mdp.n_actions, scale)


@st.composite
def policy_pairs(draw: st.DrawFn, mdp: TabularMDP) -> tuple[np.ndarray, np.ndarray]:
    """Two arbitrary teams (pi, pi'): pi' is pi tilted on every state by a random step."""
    pi = draw(team_tables(mdp))
    step = draw(st.floats(min_value=1e-3, max_value=5.0))
    rng = np.random.default_rng(draw(seeds))
    return pi, tilt(pi, rng.standard_normal(pi.shape), step)


def update_orders(n_agents: int) -> st.SearchStrategy[list[int]]:
    """Update orders sigma: every permutation of the n agents."""
    return st.permutations(list(range(n_agents)))


@st.composite
def random_agent_updates(
    draw: st.DrawFn,
    mdp: TabularMDP,
    table: np.ndarray,
    agent: int,
    occupancy: np.ndarray,
    direction: Direction | None = None,
) -> np.ndarray:
    """A random trust-region update of one agent: its rows tilted in a random logit direction
    until E_d[KL] (in ``direction``, drawn if None) reaches a drawn radius delta."""
    kl_direction = draw(directions) if direction is None else direction
    rng = np.random.default_rng(draw(seeds))
    rows = mdp.agent_of_state == agent
    return perturb_within_radius(table, rows, occupancy, draw(radii), kl_direction, rng)


@st.composite
def random_update_traces(
    draw: st.DrawFn,
    episodic: bool = False,
    direction: Direction | None = None,
    min_agents: int = 1,
    near_deterministic: bool | None = None,
) -> Trace:
    """A stage of random trust-region updates in a random order (pi_hat^0 .. pi_hat^n)."""
    mdp = draw(tabular_mdps(episodic=episodic, min_agents=min_agents))
    start = draw(team_tables(mdp, near_deterministic))
    order = draw(update_orders(mdp.n_agents))
    kl_direction = draw(directions) if direction is None else direction
    agent_radii = draw(st.lists(radii, min_size=mdp.n_agents, max_size=mdp.n_agents))
    rng = np.random.default_rng(draw(seeds))
    return stage_trace(mdp, start, order, random_proposal(mdp, rng, kl_direction, agent_radii))


@st.composite
def exact_update_traces(
    draw: st.DrawFn,
    direction: Direction | None = None,
    min_agents: int = 1,
    episodic: bool = False,
) -> Trace:
    """A stage of exact-optimal updates (``sim``'s ExactUpdater, KL-constrained maximiser of
    the surrogate under the intermediate occupancy) in a random order."""
    from proofs_check.traces import exact_proposal

    mdp = draw(tabular_mdps(episodic=episodic, min_agents=min_agents))
    start = draw(team_tables(mdp))
    order = draw(update_orders(mdp.n_agents))
    kl_direction = draw(directions) if direction is None else direction
    agent_radii: Sequence[float] = draw(
        st.lists(radii, min_size=mdp.n_agents, max_size=mdp.n_agents)
    )
    return stage_trace(mdp, start, order, exact_proposal(mdp, kl_direction, agent_radii))


@st.composite
def message_pairs(draw: st.DrawFn, max_vocab: int = 4, max_length: int = 3) -> MessagePair:
    """Two token-by-token message policies p, q (all V**T messages enumerable)."""
    return random_message_pair(
        np.random.default_rng(draw(seeds)),
        vocab_size=draw(st.integers(2, max_vocab)),
        length=draw(st.integers(1, max_length)),
        logit_scale=draw(st.floats(min_value=0.0, max_value=4.0)),
        closeness=draw(st.floats(min_value=0.01, max_value=1.5)),
    )


@st.composite
def stage0_instances(draw: st.DrawFn) -> tuple[np.ndarray, np.ndarray, float]:
    """(pi_pre, pi_cur, delta0) on a few states; delta0 a fraction of the mean KL(pi_pre||pi_cur)
    (so the constraint is active on most states and inactive on some)."""
    from teamtr.divergence import kl

    n_states = draw(st.integers(1, 3))
    n_actions = draw(st.integers(2, 5))
    rng = np.random.default_rng(draw(seeds))
    pre = random_policy_table(rng, n_states, n_actions, draw(st.floats(0.3, 4.0)))
    cur = random_policy_table(rng, n_states, n_actions, draw(st.floats(0.3, 4.0)))
    radius = draw(st.floats(0.05, 1.2)) * float(np.mean(kl(pre, cur)))
    return pre, cur, max(radius, 1e-4)
