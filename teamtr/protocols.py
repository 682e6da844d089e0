"""The parts every backend supplies to the stage loop (ARCHITECTURE.md, "The four protocols").

A backend (the exact tabular world in ``sim/``, the language-model world in ``llm/``) implements
a team policy, a sampler of decision points and an agent updater. ``teamtr.stage.run_stage``
drives them identically for every scheme.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

if TYPE_CHECKING:
    from teamtr.measured import PairedDifferences
    from teamtr.reports import AgentUpdate


@runtime_checkable
class TeamPolicy(Protocol):
    """A factorized turn-taking team: pi(a|s) = pi^{agent(s)}(a|s) (THEORY.md §1).

    Teams are values: ``with_agent`` returns a new team and never mutates ``self``, so the
    intermediate teams pi_hat^0 .. pi_hat^n of a stage can all be kept and compared.
    """

    @property
    def n_agents(self) -> int:
        """Number of agents n."""
        ...

    def agent(self, index: int) -> Any:
        """The policy of agent ``index`` (backend-specific object)."""
        ...

    def with_agent(self, index: int, policy: Any) -> TeamPolicy:
        """A new team equal to this one except that agent ``index`` plays ``policy``."""
        ...


@runtime_checkable
class Rollouts(Protocol):
    """Decision points sampled (or, in ``sim``, computed exactly) under one behaviour team."""

    @property
    def behaviour(self) -> TeamPolicy:
        """The team whose occupancy these decision points follow."""
        ...


@runtime_checkable
class Sampler(Protocol):
    """Produces rollouts of a team."""

    # Parameters are typed Any: each backend accepts its own team and rollouts types (a protocol
    # parameter typed TeamPolicy would forbid that narrowing).
    def sample(
        self,
        team: Any,
        *,
        previous: Any = None,
        updated_agent: int | None = None,
    ) -> Rollouts:
        """Fresh on-policy rollouts of ``team``.

        ``previous`` and ``updated_agent`` allow prefix reuse: if ``team`` differs from
        ``previous.behaviour`` only in agent ``updated_agent``, every turn before that agent's
        first turn has the same distribution under both teams and may be kept. Implementations
        must return exact on-policy samples of ``team`` either way.
        """
        ...

    def importance_weighted(self, rollouts: Any, team: Any) -> Rollouts:
        """``rollouts`` of their behaviour team, reweighted to stand for ``team`` (HAPPO-style).

        ``team`` differs from ``rollouts.behaviour`` only in agents already updated this stage;
        the weight of an episode is the product of those agents' probability ratios
        new/old over the actions they took in it.
        """
        ...


@runtime_checkable
class PairingSampler(Sampler, Protocol):
    """A sampler that can measure updates (optional: the stage loop records "not measured"
    for a sampler without ``with_held_out``; ``teamtr.measured`` says why the pairs bound J).

    Its draws hold out ``groups`` groups that no update sees: they are left out of what an
    updater reads (occupancy, advantages, gradient, KL). A draw made with ``previous`` and
    ``updated_agent`` continues ``previous``'s held-out groups with the new team from the
    updated agent's first turn on, and its rollouts carry the differences (``PairedRollouts``).
    A sampler may hold those continuations out again, as the next update's old sides (a
    chain: they are exact draws of the new team on groups no update read), where nothing but
    a stopping rule decided on them; with ``chained`` False every draw holds out fresh groups of
    its own, so the held-out groups that decided one update never measure another.
    """

    def with_held_out(self, groups: int, chained: bool = True) -> Sampler:
        """A sampler drawing as this one does, plus ``groups`` held-out groups per draw (it may
        share this one's random streams). ``chained`` False: no continuation is held out again
        (``accept = "measured"``, where whether the chain goes on depends on the continuations'
        rewards: the next update's old sides would be a selected sample, not a draw)."""
        ...

    def continue_held_out(
        self, team: Any, previous: Any, updated_agent: int
    ) -> PairedDifferences | None:
        """Only the pairs of ``previous``'s held-out groups continued by ``team`` from
        ``updated_agent``'s first turn, no other group drawn: how a stage's last update, which
        no update follows in the stage, is measured. None where ``previous`` holds none out."""
        ...


@runtime_checkable
class SequentialPairingSampler(PairingSampler, Protocol):
    """A pairing sampler that can also draw pairs on demand (optional: sequential held-out
    draws, ``StageConfig.certificate_batch``)."""

    def draw_pairs(
        self, old: Any, new: Any, updated_agent: int, count: int
    ) -> PairedDifferences | None:
        """``count`` fresh pairs: groups of ``old`` played now, held out of every update, each
        continued by ``new`` (which differs from ``old`` in ``updated_agent`` alone) from that
        agent's first turn, as ``continue_held_out`` continues a draw's. Drawn after the update,
        they are independent of it and of every pair before. None where returns have no bound."""
        ...


@runtime_checkable
class PairedRollouts(Protocol):
    """Rollouts of a ``PairingSampler`` draw."""

    @property
    def pairs(self) -> PairedDifferences | None:
        """New return minus old for ``previous``'s held-out groups continued by this draw's
        team (None when the draw continued nothing that was held out)."""
        ...


@runtime_checkable
class AgentUpdater(Protocol):
    """Improves one agent inside its trust region, using only the given rollouts."""

    def update(self, team: Any, agent: int, rollouts: Any, radius: float) -> AgentUpdate:
        """Maximise agent ``agent``'s surrogate on ``rollouts`` s.t. its mean KL <= ``radius``.

        ``team.agent(agent)`` is the agent's current (pre-update) policy. Advantages and the
        occupancy come from ``rollouts`` only: for the stale scheme they are the stage-start ones,
        which is the point of the comparison (Thm 3.7).
        """
        ...
