"""Stage-0 alignment of a new adapter to the agent it replaces (THEORY.md §2, last part).

Before π_pre (a new adapter) replaces agent k, it is projected into the trust region around the
current agent π_cur on a probe set:

    π_new = argmin_π E_{s∼d_{π_cur}} KL(π‖π_pre)(s)   s.t.   E_{s∼d_{π_cur}} KL(π‖π_cur)(s) ≤ δ0.

States s are token contexts: the prefixes of agent k's own messages in probe dialogues sampled by
the current team (so s ∼ d_{π_cur}); both KLs are exact over the vocabulary at each of those
tokens and averaged over all of them (one mean constraint, as in the trust region of Thm 3.4).

Over unrestricted policies the problem has the closed form of ``teamtr.alignment`` with one
multiplier λ shared by all states (the constraint is one mean):

    π_λ ∝ π_pre^{1/(1+λ)} π_cur^{λ/(1+λ)},

the minimiser of the Lagrangian KL(π‖π_pre) + λ KL(π‖π_cur) at every state. An adapter cannot
represent π_λ exactly, so ``align_adapter`` approximates it in three steps:

1. λ of the closed form, by bisection on β = 1/(1+λ) over the stored logits (E KL(π_β‖π_cur)
   increases with β: its derivative is β Var_β[log π_pre/π_cur] ≥ 0 per state). E KL(π_λ‖π_pre)
   is the smallest objective any policy can reach on the probe tokens: ``closed_form_kl_to_pre``.
2. A feasible start: the adapter weights θ(t) = θ_cur + t (θ_pre − θ_cur), t ∈ [0, 1], with t found
   by bisection so that E KL(π_θ(t)‖π_cur) ≤ δ0 (t = 0 is π_cur itself, always inside). t = 1 is
   π_pre, returned unchanged when it is already inside (λ = 0, complementary slackness).
3. Adam steps on the Lagrangian KL(π‖π_pre) + μ KL(π‖π_cur), starting at μ = λ, each one measured
   after the step and admitted only if the constraint still holds and E KL(π‖π_pre) went down;
   otherwise parameters and optimiser state are restored exactly and the step is retried smaller
   (``teamtr.trust_region.backtrack``, as in ``llm.update.updater.TrustRegionUpdater``); when no shrunk
   step is admitted, μ is raised (dual ascent: in weight space the constraint binds harder than
   the closed form's λ says). Every returned policy has been measured inside δ0.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass

import torch

from llm.conversation.dialogue import ChatFormat, Episode
from llm.logprobs.losses import token_kl_from_logits
from llm.logprobs.scoring import message_logits, score_chunks
from llm.models.agents import AdapterWeights, LoraTeam
from llm.sampling.sampler import SamplerSettings
from llm.update.backtracking import backtracked_step
from teamtr.trust_region import TrustRegion


class AlignmentError(ValueError):
    """The probe set cannot support an alignment (e.g. the agent never speaks in it)."""


@dataclass(frozen=True)
class AlignmentSettings:
    """Hyper-parameters of the Stage-0 alignment."""

    delta0: float = 0.02
    """δ0: the largest admitted mean token-level KL(π_new‖π_cur) on the probe tokens (nats)."""
    learning_rate: float = 2e-4
    """Adam step size of the refining gradient steps before any backtracking."""
    steps: int = 8
    """Refining gradient steps on the Lagrangian (each checked against δ0); 0 = interpolation only."""
    shrink: float = 0.5
    """Learning-rate factor per backtrack."""
    max_backtracks: int = 4
    """Backtracks per step and penalty before the penalty is raised."""
    penalty_growth: float = 4.0
    """Factor on the Lagrangian's weight of KL(π‖π_cur) when no shrunk step is admitted."""
    penalty_increases: int = 3
    """Penalty raises per step before the refinement stops at the last admitted iterate."""
    bisection_steps: int = 12
    """Bisection iterations for the interpolation weight t (each one a forward pass)."""

    def __post_init__(self) -> None:
        if not (math.isfinite(self.delta0) and self.delta0 > 0):
            raise ValueError(f"delta0 must be finite and > 0, got {self.delta0!r}")
        if self.learning_rate <= 0:
            raise ValueError(f"learning_rate must be > 0, got {self.learning_rate}")
        if min(self.steps, self.bisection_steps, self.max_backtracks, self.penalty_increases) < 0:
            raise ValueError(
                "steps, bisection_steps, max_backtracks and penalty_increases must be >= 0"
            )
        if self.penalty_growth <= 1:
            raise ValueError(f"penalty_growth must be > 1, got {self.penalty_growth}")
        if not 0 < self.shrink < 1:
            raise ValueError(f"shrink must lie in (0, 1), got {self.shrink}")


@dataclass(frozen=True)
class AlignmentResult:
    """The aligned adapter and what the alignment measured (all KLs: mean over probe tokens)."""

    policy: AdapterWeights
    """π_new, the adapter to put in agent k's slot."""
    kl_to_pre: float
    """E KL(π_new‖π_pre): the objective (0 when π_pre was already inside δ0)."""
    kl_to_cur: float
    """E KL(π_new‖π_cur): the constraint, ≤ δ0."""
    pre_kl_to_cur: float
    """E KL(π_pre‖π_cur): how far a direct swap moves agent k on the probe tokens."""
    closed_form_kl_to_pre: float
    """E KL(π_λ‖π_pre) of the unrestricted closed form: a lower bound on ``kl_to_pre``."""
    multiplier: float
    """λ of the closed form (0 when π_pre was inside; inf if only π_cur fits)."""
    penalty: float
    """The weight of KL(π‖π_cur) in the Lagrangian at the last gradient step (starts at λ)."""
    interpolation: float
    """t of the feasible starting point θ_cur + t (θ_pre − θ_cur) (1 = π_pre)."""
    interpolated_kl_to_pre: float
    """E KL(π_θ(t)‖π_pre) at that starting point, before the gradient steps."""
    steps: int
    """Admitted refining gradient steps."""
    backtracks: int
    """Step shrinks over all refining steps (a rejected final step counts its tries)."""
    tokens: int
    """Probe tokens (agent k's message tokens) both KLs are averaged over."""
    delta0: float

    def summary(self) -> dict[str, float | int]:
        """Every field except the weights, for ``swap.json``."""
        out = asdict(self)
        out.pop("policy")
        return out


@dataclass
class _ProbeChunk:
    """One chunk of probe episodes with both reference policies' log-probs at k's tokens."""

    indices: list[int]
    mask: torch.Tensor
    logp_pre: torch.Tensor
    logp_cur: torch.Tensor


@dataclass(frozen=True)
class _Measurement:
    kl_to_pre: float
    kl_to_cur: float


def _masked_sum(per_token: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    return torch.where(mask, per_token, torch.zeros_like(per_token)).sum()


class _Probe:
    """Agent k's tokens in the probe dialogues, scored by whatever weights sit in slot k."""

    def __init__(
        self,
        team: LoraTeam,
        agent: int,
        chat: ChatFormat,
        episodes: Sequence[Episode],
        sampling: SamplerSettings,
    ) -> None:
        self.team = team
        self.agent = agent
        self.chat = chat
        self.episodes = tuple(episodes)
        self.sampling = sampling
        self.backbone = team.backbone
        self.parameters = self.backbone.parameters_of(agent)

    def set_weights(self, tensors: dict[str, torch.Tensor]) -> None:
        with torch.no_grad():
            for key, parameter in self.parameters.items():
                parameter.copy_(tensors[key])
        self.backbone.mark_modified(self.agent)

    def log_probs(self, indices: list[int]) -> tuple[torch.Tensor, torch.Tensor] | None:
        """(mask, log π(·|s)) at agent k's tokens of episodes ``indices`` (differentiable)."""
        batch = message_logits(
            self.backbone.training_model(self.agent),
            self.chat,
            self.episodes,
            self.agent,
            indices,
            self.sampling.temperature,
        )
        if batch is None:
            return None
        return batch.mask, batch.log_probs()

    def references(self, pre: AdapterWeights, cur: AdapterWeights) -> list[_ProbeChunk]:
        self.team.use(self.agent)  # the team's weights in every slot, agent k speaking
        scored = {}
        for name, weights in (("pre", pre), ("cur", cur)):
            self.set_weights(dict(weights.tensors))
            with torch.no_grad():
                scored[name] = list(
                    score_chunks(
                        self.backbone.training_model(self.agent),
                        self.chat,
                        self.episodes,
                        self.agent,
                        self.sampling.score_chunk,
                        self.sampling.temperature,
                    )
                )
        return [
            _ProbeChunk(indices, cur_batch.mask, pre_batch.log_probs(), cur_batch.log_probs())
            for (indices, pre_batch), (_, cur_batch) in zip(
                scored["pre"], scored["cur"], strict=True
            )
        ]

    def losses(self, chunk: _ProbeChunk) -> tuple[torch.Tensor, torch.Tensor]:
        """Summed (not averaged) KL(π‖π_pre) and KL(π‖π_cur) over the chunk's tokens."""
        scored = self.log_probs(chunk.indices)
        assert scored is not None  # the chunk was kept because agent k speaks in it
        mask, logp = scored
        to_pre = _masked_sum(token_kl_from_logits(logp, chunk.logp_pre), mask)
        to_cur = _masked_sum(token_kl_from_logits(logp, chunk.logp_cur), mask)
        return to_pre, to_cur


def _closed_form(
    references: list[_ProbeChunk], delta0: float, n_tokens: int, iterations: int = 40
) -> tuple[float, float]:
    """λ and E KL(π_λ‖π_pre) of the shared-multiplier closed form (THEORY.md, Stage-0)."""

    def kls(beta: float) -> tuple[float, float]:
        to_pre = to_cur = 0.0
        for chunk in references:
            tilted = beta * chunk.logp_pre + (1.0 - beta) * chunk.logp_cur
            to_pre += float(_masked_sum(token_kl_from_logits(tilted, chunk.logp_pre), chunk.mask))
            to_cur += float(_masked_sum(token_kl_from_logits(tilted, chunk.logp_cur), chunk.mask))
        return to_pre / n_tokens, to_cur / n_tokens

    if kls(1.0)[1] <= delta0:
        return 0.0, 0.0
    low, high = 0.0, 1.0  # KL(π_low‖π_cur) <= delta0 < KL(π_high‖π_cur)
    for _ in range(iterations):
        middle = 0.5 * (low + high)
        if kls(middle)[1] <= delta0:
            low = middle
        else:
            high = middle
    multiplier = 1.0 / low - 1.0 if low > 0 else math.inf
    return multiplier, kls(low)[0]


def align_adapter(
    team: LoraTeam,
    agent: int,
    pre: AdapterWeights,
    chat: ChatFormat,
    probe_episodes: Sequence[Episode],
    settings: AlignmentSettings | None = None,
    sampling: SamplerSettings | None = None,
) -> AlignmentResult:
    """Project ``pre`` into {π : E KL(π‖π_cur) ≤ δ0} around ``team``'s agent ``agent``.

    ``probe_episodes`` are complete dialogues sampled by ``team`` (agent ``agent`` must speak in
    them). ``sampling`` is the team's sampler settings: the policy is softmax(logits /
    ``sampling.temperature``) as in sampling and training, and probe episodes are scored
    ``sampling.score_chunk`` at a time. ``team`` itself is not changed; agent ``agent``'s slot
    of its backbone is used as scratch space and ends holding the returned policy.
    """
    s = settings or AlignmentSettings()
    if not 0 <= agent < team.n_agents:
        raise AlignmentError(f"agent must lie in [0, {team.n_agents}), got {agent}")
    cur = team.agent(agent)
    if pre.tensors.keys() != cur.tensors.keys() or any(
        pre.tensors[key].shape != cur.tensors[key].shape for key in cur.tensors
    ):
        raise AlignmentError("the new adapter's tensors do not match the agent's LoRA slot")
    projection = _Projection(
        team,
        agent,
        pre,
        cur,
        _Probe(team, agent, chat, probe_episodes, sampling or SamplerSettings()),
        s,
    )
    # Complementary slackness: π_pre already inside the region is its own projection (λ = 0).
    if projection.trust_region.admits(projection.pre_kl_to_cur):
        return projection.result(
            dict(pre.tensors),
            _Measurement(0.0, projection.pre_kl_to_cur),
            0.0,
            0.0,
            1.0,
            0.0,
            policy=pre,
        )
    # 1. The closed form's multiplier λ on the probe tokens.
    multiplier, closed_form = _closed_form(projection.references, s.delta0, projection.n_tokens)
    # 2. A feasible start on the weight segment from θ_cur (t = 0) to θ_pre (t = 1).
    low, start, at_start = projection.feasible_start()
    if s.steps == 0 or not math.isfinite(multiplier):
        return projection.result(start, at_start, multiplier, closed_form, low, at_start.kl_to_pre)
    # 3. Gradient steps on the Lagrangian KL(π‖π_pre) + λ KL(π‖π_cur), kept inside δ0.
    final, current, steps, backtracks, penalty = projection.lagrangian_steps(
        start, at_start, multiplier
    )
    return projection.result(
        final,
        current,
        multiplier,
        closed_form,
        low,
        at_start.kl_to_pre,
        steps,
        backtracks,
        penalty=penalty,
    )


class _Projection:
    """The probe, its reference log-probs and the region of one ``align_adapter`` call, with
    one method per step of the projection (the module's docstring)."""

    def __init__(
        self,
        team: LoraTeam,
        agent: int,
        pre: AdapterWeights,
        cur: AdapterWeights,
        probe: _Probe,
        settings: AlignmentSettings,
    ) -> None:
        self.team, self.agent, self.pre, self.cur = team, agent, pre, cur
        self.probe = probe
        self.settings = settings
        self.references = probe.references(pre, cur)
        self.n_tokens = sum(int(chunk.mask.sum()) for chunk in self.references)
        if self.n_tokens == 0:
            raise AlignmentError(f"agent {agent} never speaks in the probe dialogues")
        self.trust_region = TrustRegion(settings.delta0, tolerance=0.0)
        probe.set_weights(dict(pre.tensors))
        self.pre_kl_to_cur = self.measure().kl_to_cur

    def measure(self) -> _Measurement:
        """E KL(π‖π_pre) and E KL(π‖π_cur) over the probe tokens, at the slot's weights."""
        to_pre = to_cur = 0.0
        with torch.no_grad():
            for chunk in self.references:
                a, b = self.probe.losses(chunk)
                to_pre, to_cur = to_pre + float(a), to_cur + float(b)
        return _Measurement(to_pre / self.n_tokens, to_cur / self.n_tokens)

    def interpolated(self, t: float) -> dict[str, torch.Tensor]:
        cur, pre = self.cur.tensors, self.pre.tensors
        return {key: torch.lerp(cur[key], pre[key], t) for key in cur}

    def feasible_start(self) -> tuple[float, dict[str, torch.Tensor], _Measurement]:
        """The largest t found by bisection with θ(t) inside δ0, its weights and measurement."""
        low, high = 0.0, 1.0  # invariant: θ(low) inside the region, θ(high) outside
        self.probe.set_weights(dict(self.cur.tensors))
        low_measured = self.measure()
        for _ in range(self.settings.bisection_steps):
            middle = 0.5 * (low + high)
            self.probe.set_weights(self.interpolated(middle))
            measured = self.measure()
            if self.trust_region.admits(measured.kl_to_cur):
                low, low_measured = middle, measured
            else:
                high = middle
        return low, self.interpolated(low), low_measured

    def lagrangian_steps(
        self, start: dict[str, torch.Tensor], at_start: _Measurement, multiplier: float
    ) -> tuple[dict[str, torch.Tensor], _Measurement, int, int, float]:
        """Adam steps on KL(π‖π_pre) + μ KL(π‖π_cur) from ``start``, μ from λ upwards; returns
        the last admitted weights, their measurement, steps, backtracks and the final μ."""
        s, probe = self.settings, self.probe
        probe.set_weights(start)
        probe.backbone.speak_as(self.agent)
        parameters = list(probe.parameters.values())
        optimizer = torch.optim.Adam(parameters, lr=s.learning_rate)
        current = at_start

        def admitted_statistic(measured: _Measurement) -> float:
            # Inside δ0 is the trust region's test; a step must also lower the objective.
            return measured.kl_to_cur if measured.kl_to_pre < current.kl_to_pre else math.nan

        steps = backtracks = 0
        penalty = multiplier
        for _ in range(s.steps):
            for _ in range(s.penalty_increases + 1):

                def lagrangian_gradient(penalty: float = penalty) -> None:
                    for chunk in self.references:
                        to_pre, to_cur = probe.losses(chunk)
                        ((to_pre + penalty * to_cur) / self.n_tokens).backward()

                result = backtracked_step(
                    parameters,
                    optimizer,
                    s.learning_rate,
                    lagrangian_gradient,
                    self.measure,
                    admitted_statistic,
                    self.trust_region,
                    shrink=s.shrink,
                    max_backtracks=s.max_backtracks,
                )
                backtracks += result.backtracks
                if result.accepted:
                    break
                # Dual ascent: in weight space the constraint binds harder than the closed
                # form's λ says, so weigh KL(π‖π_cur) more and try the step again.
                penalty *= s.penalty_growth
            if not result.accepted or result.candidate is None:
                break  # backtracked_step restored the last admitted iterate
            steps += 1
            current = result.candidate
        optimizer.zero_grad(set_to_none=True)
        final = {key: p.detach().clone() for key, p in probe.parameters.items()}
        return final, current, steps, backtracks, penalty

    def result(
        self,
        policy_tensors: dict[str, torch.Tensor],
        measured: _Measurement,
        multiplier: float,
        closed_form: float,
        interpolation: float,
        interpolated_kl_to_pre: float,
        steps: int = 0,
        backtracks: int = 0,
        policy: AdapterWeights | None = None,
        penalty: float | None = None,
    ) -> AlignmentResult:
        """The slot set to ``policy_tensors`` and what the projection measured on the way."""
        self.probe.set_weights(policy_tensors)
        return AlignmentResult(
            policy=policy if policy is not None else self.team.backbone.snapshot(self.agent),
            kl_to_pre=measured.kl_to_pre,
            kl_to_cur=measured.kl_to_cur,
            pre_kl_to_cur=self.pre_kl_to_cur,
            closed_form_kl_to_pre=closed_form,
            multiplier=multiplier,
            penalty=multiplier if penalty is None else penalty,
            interpolation=interpolation,
            interpolated_kl_to_pre=interpolated_kl_to_pre,
            steps=steps,
            backtracks=backtracks,
            tokens=self.n_tokens,
            delta0=self.settings.delta0,
        )
