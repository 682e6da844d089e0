"""One agent's trust-region update on dialogue rollouts (THEORY.md §2, Thm 3.4).

The loss is the clipped surrogate (``llm.logprobs.losses.clipped_surrogate``) on the agent's own message
tokens, with the episode's group-normalised advantage (times its HAPPO weight, if any). After
every optimiser step the KL to the agent's pre-update policy is measured on the batch; when the
trust-region statistic exceeds delta_i, parameters and optimiser state are restored exactly and
the step is retried with a smaller learning rate (``teamtr.trust_region.backtrack``). A step that
cannot be brought inside ends the update at the last admitted iterate; if not even the first
step can, the update is rejected and the old policy is kept. A non-finite loss, gradient, KL or
surrogate at any step rejects the whole update: parameters and optimiser state go back to what
they were before it (a NaN must not reach Adam's moments, which outlive the update), and the
result names the quantity (``llm.update.outcome``: how the update ended, typed).

``TrustRegionUpdater.update`` reads top to bottom: (1) the updates that need no forward pass
(no reward signal, the agent never spoke); (2) the behaviour log-probs
(``DialogueRollouts.behaviour_logps``), one pass at the pre-update parameters
(``_reference_pass``: the reference log-probs every ratio and KL is measured against, and the
first step's gradient), and the check that the ratio is 1 there (``_check_on_policy``); (3) the
trust-region steps (``_steps``), one ``llm.update.backtracking.backtracked_step`` per Adam step,
whose gradient (``_accumulate_gradient``) and measurement (``_checked_measure``) are plain
methods, and whose step size one ``StepSize`` keeps; (4) the report (``_report``).

What is reported (``llm.update.outcome.LoraUpdate``, a ``teamtr.reports.AgentUpdate``), on the turn-level episodic MDP of horizon H:
- ``kl`` = E_{d̄}[KL_i] = (1/H) · mean over episodes of the sum of the agent's message KLs,
  each message KL a sum of per-token terms (Lemma 3.1);
- ``surrogate`` = L̂_i = mean over episodes of Σ_{agent's turns} (message ratio new/old) · Â,
  an estimate of E_{new}[Â] since E_{y~old}[(new/old) Â] = E_{y~new}[Â];
- ``advantage_bound`` = A_max, the clip applied to Â.
"""

from __future__ import annotations

import functools
import math
import operator
from dataclasses import dataclass, replace

import numpy as np
import torch
from peft import PeftModel

from llm.common import profiling
from llm.common.collective import Collective
from llm.common.settings import UpdaterSettings
from llm.conversation.dialogue import ChatFormat
from llm.logprobs.losses import (
    clipped_surrogate,
    per_token_kl,
    per_token_kl_from_log_probs,
)
from llm.logprobs.scoring import MessageBatch, message_logits, message_tokens, score_chunks
from llm.models.agents import LoraTeam, weights_dtype
from llm.models.precision import is_half
from llm.sampling.rollouts import DialogueRollouts
from llm.update.backtracking import ParameterSnapshot, backtracked_step
from llm.update.mismatch import (
    MismatchTally,
    PolicyMismatch,
    laid_out,
    message_weights_of,
    mismatch_kl_tolerance,
    truncated_weights,
)
from llm.update.outcome import LoraUpdate, Outcome, effective_sample_size
from teamtr.trust_region import TrustRegion, statistic_of

STEP_SCALE_KEY = "teamtr_step_scale"
"""Optimiser param-group key holding the warm-started step size (saved with Adam's state)."""


class NonFiniteUpdate(ArithmeticError):
    """Raised inside an update when ``quantity`` (loss, gradient, kl, surrogate) is not finite."""

    def __init__(self, quantity: str) -> None:
        super().__init__(f"non-finite {quantity}")
        self.quantity = quantity


class RatioCheckError(AssertionError):
    """Before an update the new/old ratio must be 1: the rollouts' behaviour log-probs do not
    match the agent's policy (stale rollouts, a different temperature, or dropout)."""


def _finite(gradient: list[torch.Tensor | None]) -> bool:
    return all(g is None or bool(torch.isfinite(g).all()) for g in gradient)


@dataclass
class _Reference:
    """The pre-update policy on one chunk: what every KL and ratio is measured against."""

    indices: list[int]
    batch: MessageBatch
    logps: torch.Tensor
    advantages: torch.Tensor
    log_probs: torch.Tensor | None = None
    """(M, T, V) log-softmax of ``batch.logits``, kept once per update (None: recompute it)."""
    message_weights: torch.Tensor | None = None
    """(M,) min(π/μ, C) of each whole message where the update corrects for the sampler's
    policy μ (``llm.update.mismatch``): the surrogate L̂_i's importance weight; None: 1."""

    def vocabulary_log_probs(self) -> torch.Tensor:
        return self.batch.log_probs() if self.log_probs is None else self.log_probs

    @property
    def has_signal(self) -> bool:
        """False when every (weighted) advantage of the chunk is 0: its clipped surrogate is
        0 x ratio whatever the parameters, so its gradient is exactly 0 and computing it can
        be skipped. Dynamic sampling's filler groups (no reward difference) are such chunks."""
        return bool(self.advantages.any())


@dataclass(frozen=True)
class _ReferencePass:
    """What one pass over the batch at the pre-update parameters gives (``_reference_pass``)."""

    chunks: list[_Reference]
    n_tokens: int
    """The agent's message tokens in the global batch (the pooled token mean's denominator)."""
    first_gradient: list[torch.Tensor | None] | None
    """The first step's gradient, summed over ranks (``reuse_work`` and signal; else None)."""
    non_finite: str | None
    """``"loss"`` or ``"gradient"`` when the first step's was not finite (the update is then
    rejected before any step)."""


@dataclass(frozen=True)
class _Measurement:
    kl: float
    kl_quantile: float
    surrogate: float
    statistic: float


@dataclass
class _Walk:
    """Where an update's trust-region steps got to (``TrustRegionUpdater._steps``)."""

    step_size: StepSize
    last: _Measurement | None = None
    """The last admitted iterate's measurement (None: no step admitted)."""
    last_tried: float = math.nan
    """The statistic of the step that could not be brought inside, where one could not."""
    backtracks: int = 0
    steps: int = 0
    non_finite: str | None = None


@dataclass
class StepSize:
    """Where an agent's steps start, as a fraction of ``learning_rate``, and how that moves:
    the whole step-size rule of an update in one place (as scipy's trust-region driver keeps
    its radius rule). A rejected step (no shrink within ``max_backtracks`` fits the region)
    leaves the next update starting where this one gave up; with ``warm_start`` an accepted
    step starts the next one at its own scale; an update that never backtracked tries a step
    ``1 / shrink`` larger next time (at most the full learning rate)."""

    scale: float
    shrink: float
    max_backtracks: int
    warm_start: bool

    def on_accept(self, step_scale: float) -> None:
        if self.warm_start:
            self.scale = step_scale

    def on_reject(self) -> None:
        self.scale *= self.shrink**self.max_backtracks

    def after_update(self, backtracks: int, non_finite: bool) -> float:
        """The scale the agent's next update starts from (1 without ``warm_start``)."""
        if not non_finite and backtracks == 0:
            self.scale = min(1.0, self.scale / self.shrink)
        return self.scale if self.warm_start else 1.0


class TrustRegionUpdater:
    """Implements ``teamtr.protocols.AgentUpdater`` for ``LoraTeam``s.

    Keeps one Adam optimiser per agent across stages (its state is part of a checkpoint).

    ``reuse_work`` (default) computes each quantity once where the straightforward path computes
    it again with bit-identical (or, for ``share_prompt``, float-rounding-equal) results: the
    pass that scores the pre-update policy also gives the first step's gradient (the loss there
    is the surrogate at ratio 1), every backtrack reuses its step's gradient
    (``llm.update.backtracking``), and the pre-update log-softmax over the vocabulary is kept for every
    KL measurement, each GRPO group's prompt is scored once (``llm.logprobs.scoring.message_logits``;
    the sampler's ``reuse_work`` must match, so that the ratio check compares two identical
    computations), and a chunk whose advantages are all 0 (dynamic sampling's filler groups)
    gets no gradient pass: its gradient is exactly 0 (``_Reference.has_signal``; it is still
    scored, since the trust region's KL is a mean over the whole batch). ``reuse_work=False``
    is the straightforward path, kept as the reference the equality tests and the stage
    profile compare against.
    """

    def __init__(
        self,
        chat: ChatFormat,
        settings: UpdaterSettings,
        score_chunk: int = 8,
        collective: Collective | None = None,
        *,
        reuse_work: bool = True,
        share_prompt: bool | None = None,
    ) -> None:
        self.chat = chat
        self.settings = settings
        self.score_chunk = score_chunk
        self.reuse_work = reuse_work
        self._share_prompt = share_prompt
        self.optimizers: dict[int, torch.optim.Optimizer] = {}
        self.collective = collective or Collective()
        """With data parallelism (``llm.training.distributed``) each rank holds a shard of the rollouts:
        token counts, gradients, per-episode KLs and surrogates are combined over the ranks, so
        every decision below is taken on the global batch, identically on every rank."""

    @property
    def share_prompt(self) -> bool:
        """Score each group's prompt once (unless set otherwise: as ``reuse_work``)."""
        return self.reuse_work if self._share_prompt is None else self._share_prompt

    def optimizer_for(self, team: LoraTeam, agent: int) -> torch.optim.Optimizer:
        if agent not in self.optimizers:
            parameters = list(team.backbone.parameters_of(agent).values())
            self.optimizers[agent] = torch.optim.Adam(parameters, lr=self.settings.learning_rate)
        return self.optimizers[agent]

    def step_scale(self, team: LoraTeam, agent: int) -> float:
        """Where the agent's next step starts, as a fraction of ``learning_rate``."""
        if not self.settings.warm_start:
            return 1.0
        groups = self.optimizer_for(team, agent).param_groups
        return float(groups[0].get(STEP_SCALE_KEY, 1.0))

    def _store_step_scale(self, optimizer: torch.optim.Optimizer, scale: float) -> None:
        """Keep ``scale`` in the optimiser's param groups, whose state a checkpoint saves (so a
        resumed run warm-starts where it stopped), and put the learning rate back."""
        for group in optimizer.param_groups:
            group["lr"] = self.settings.learning_rate
            group[STEP_SCALE_KEY] = scale

    # -- measurements ---------------------------------------------------------------------------
    def _score(self, model: PeftModel, rollouts: DialogueRollouts, agent: int, indices):
        batch = message_logits(
            model,
            self.chat,
            rollouts.episodes,
            agent,
            indices,
            rollouts.temperature,  # the policy's T, as the rollouts were sampled
            share_prompt=self.share_prompt,
        )
        assert batch is not None  # the chunk was kept because the agent speaks in it
        return batch

    def _surrogate_loss(
        self, batch: MessageBatch, reference: _Reference, n_tokens: int, logps: torch.Tensor
    ) -> torch.Tensor:
        """The chunk's share of the pooled token-mean loss -L (to be minimised)."""
        share = batch.n_tokens / n_tokens  # pooled token mean over all chunks
        loss = (
            -clipped_surrogate(
                logps, reference.logps, reference.advantages, batch.mask, self.settings.clip_eps
            )
            * share
        )
        return loss

    def _reference_pass(
        self,
        team: LoraTeam,
        agent: int,
        rollouts: DialogueRollouts,
        n_tokens: int,
        sampled: dict[tuple[int, int], torch.Tensor] | None = None,
        cap: float | None = None,
    ) -> _ReferencePass:
        """The pre-update policy on every chunk: what every ratio and KL is measured against.

        With ``reuse_work`` the same pass back-propagates the first step's loss: at the
        pre-update parameters the new policy is the reference itself, so the first step's
        training forward pass would repeat this one exactly. That gradient is returned, not
        left behind in ``.grad``.

        With a correction ``cap`` C, each token's advantage is weighted by min(π/μ, C) against
        the ``sampled`` log-probs μ (truncated importance sampling, ``llm.update.mismatch``).
        """
        model = team.use(agent)
        weights = rollouts.episode_weights()
        chunks = []
        finite_loss = True
        with profiling.section("reference logits"), torch.set_grad_enabled(self.reuse_work):
            for chunk, batch in score_chunks(
                model,
                self.chat,
                rollouts.episodes,
                agent,
                self.score_chunk,
                rollouts.temperature,
                share_prompt=self.share_prompt,
            ):
                log_probs = batch.log_probs()
                logps = batch.token_logps(log_probs)
                advantages, message_weights = _weighted_advantages(
                    rollouts, weights, batch, logps, sampled, cap
                )
                if not self.reuse_work:
                    chunks.append(
                        _Reference(chunk, batch, logps, advantages, None, message_weights)
                    )
                    continue
                detached = MessageBatch(batch.refs, batch.tokens, batch.mask, batch.logits.detach())
                reference = _Reference(
                    chunk, detached, logps.detach(), advantages, log_probs.detach(), message_weights
                )
                chunks.append(reference)
                if finite_loss and reference.has_signal:  # else its gradient is exactly 0
                    loss = self._surrogate_loss(batch, reference, n_tokens, logps)
                    finite_loss = bool(torch.isfinite(loss))
                    if finite_loss:
                        with profiling.section("train backward"):
                            loss.backward()
        if not self.reuse_work:
            return _ReferencePass(chunks, n_tokens, None, None)
        if self.collective.any(not finite_loss):
            return _ReferencePass(chunks, n_tokens, None, "loss")
        gradient = self._taken_gradient(team, agent)
        return _ReferencePass(chunks, n_tokens, gradient, None if _finite(gradient) else "gradient")

    def _taken_gradient(self, team: LoraTeam, agent: int) -> list[torch.Tensor | None]:
        """The agent's gradient, summed over the ranks (the pooled token mean over the global
        batch), taken out of ``.grad`` so that nothing is left behind there."""
        parameters = list(team.backbone.parameters_of(agent).values())
        self.collective.sum_gradients(parameters)
        gradient = [None if p.grad is None else p.grad.detach().clone() for p in parameters]
        for parameter in parameters:
            parameter.grad = None
        return gradient

    def _correction_cap(self, half: bool) -> float | None:
        """C of the truncated importance weights, or None where the update is uncorrected
        (``[updater] mismatch_correction``; "auto": corrected in half precision only)."""
        mode = self.settings.mismatch_correction
        if mode == "tis" or (mode == "auto" and half):
            return self.settings.tis_cap
        return None

    def _check_on_policy(
        self,
        agent: int,
        chunks: list[_Reference],
        behaviour: dict[tuple[int, int], torch.Tensor],
        recorded: bool,
        precision: torch.dtype,
        cap: float | None,
    ) -> PolicyMismatch | None:
        """Before any step the new/old ratio must be 1: the reference pass's log-probs of every
        message equal the behaviour log-probs (else ``RatioCheckError``: stale rollouts,
        another temperature, dropout). In float32, every token to ``ratio_tolerance``; in half
        precision the sampler's recorded log-probs, whose KL from the trainer's per token must
        lie within what rounding explains (``llm.update.mismatch.mismatch_kl_tolerance``).
        Checked once all ranks have scored their shard, so that all of them raise together.
        Returns the sampler's mismatch where ``behaviour`` is what the sampler recorded (else
        None: the behaviour log-probs are the trainer's own)."""
        half = is_half(precision)
        worst = (0.0, "")
        tally = MismatchTally()
        tolerance = self.settings.ratio_tolerance
        for chunk in chunks:
            for row, (e, t) in enumerate(chunk.batch.refs):
                now = chunk.logps[row][chunk.batch.mask[row]]
                gaps = now - behaviour[(e, t)].to(now.device)
                gap = float(gaps.abs().max())
                if math.isnan(gap):  # NaN > tolerance is False: count it as infinitely far
                    gap = math.inf
                if gap > worst[0]:
                    worst = (gap, f"agent {agent}, episode {e}, turn {t}")
                if recorded:
                    tally.add(gaps, tolerance, cap)
        largest = self.collective.max(worst[0])
        mismatch = None
        if recorded:
            kl_tolerance = mismatch_kl_tolerance(precision) if half else math.inf
            together = tally.summed(self.collective.sum, self.collective.max)
            mismatch = together.result(tolerance, kl_tolerance)
        if half and mismatch is not None:
            if not mismatch.kl <= mismatch.kl_tolerance:  # NaN included
                raise RatioCheckError(
                    f"agent {agent}: the sampler's log-probs lie KL {mismatch.kl:.3g} nats a token "
                    f"from the trainer's before the update, above the {mismatch.kl_tolerance:.3g} "
                    f"that rounding to {str(precision).removeprefix('torch.')} explains "
                    "(stale rollouts?)"
                )
            return mismatch
        if not largest <= tolerance:  # NaN included
            where = worst[1] if worst[0] == largest else f"agent {agent}, on another rank"
            raise RatioCheckError(
                f"{where}: |log new - log old| = {largest:.3g} before the update (ratio must be 1)"
            )
        return mismatch

    def _accumulate_gradient(
        self,
        team: LoraTeam,
        agent: int,
        rollouts: DialogueRollouts,
        references: list[_Reference],
        n_tokens: int,
    ) -> None:
        """Add the surrogate's gradient at the current parameters to their ``.grad`` (one
        training forward and backward pass per chunk), summed over ranks."""
        model = team.backbone.training_model(agent)
        finite_loss = True
        for reference in references:
            if self.reuse_work and not reference.has_signal:
                continue  # a zero gradient: adding it changes no float of the sum
            with profiling.section("train forward"):
                batch = self._score(model, rollouts, agent, reference.indices)
                loss = self._surrogate_loss(batch, reference, n_tokens, batch.token_logps())
            if not torch.isfinite(loss):
                finite_loss = False
                break
            with profiling.section("train backward"):
                loss.backward()
        if self.collective.any(not finite_loss):
            raise NonFiniteUpdate("loss")
        parameters = list(team.backbone.parameters_of(agent).values())
        self.collective.sum_gradients(parameters)  # the pooled token mean over the global batch
        if not _finite([p.grad for p in parameters]):
            raise NonFiniteUpdate("gradient")

    def _checked_measure(
        self,
        team: LoraTeam,
        agent: int,
        rollouts: DialogueRollouts,
        references: list[_Reference],
    ) -> _Measurement:
        """``_kl_and_surrogate`` at the current parameters, refusing a non-finite KL or surrogate."""
        with profiling.section("kl measurement"):
            measured = self._kl_and_surrogate(team, agent, rollouts, references)
        if not (np.isfinite(measured.kl) and np.isfinite(measured.statistic)):
            raise NonFiniteUpdate("kl")
        if not np.isfinite(measured.surrogate):
            raise NonFiniteUpdate("surrogate")
        return measured

    def _kl_and_surrogate(
        self,
        team: LoraTeam,
        agent: int,
        rollouts: DialogueRollouts,
        references: list[_Reference],
    ) -> _Measurement:
        """E_d̄[KL_i] (its mean and quantile), the surrogate L̂_i and the admitted statistic."""
        model = team.backbone.training_model(agent)
        n_episodes = len(rollouts.episodes)
        episode_kl = np.zeros(n_episodes)
        episode_gain = np.zeros(n_episodes)
        for reference in references:
            with torch.no_grad():
                batch = self._score(model, rollouts, agent, reference.indices)
                if self.reuse_work:
                    log_probs = batch.log_probs()
                    terms = per_token_kl_from_log_probs(
                        log_probs,
                        reference.vocabulary_log_probs(),
                        batch.tokens,
                        batch.mask,
                        estimator=self.settings.estimator,
                        direction=self.settings.direction,
                    )
                    logps = batch.token_logps(log_probs)
                else:
                    terms = per_token_kl(
                        batch.logits,
                        reference.batch.logits,
                        batch.tokens,
                        batch.mask,
                        estimator=self.settings.estimator,
                        direction=self.settings.direction,
                    )
                    logps = batch.token_logps()
            message_kl = terms.sum(dim=-1)
            log_ratio = (logps - reference.logps).sum(dim=-1)
            ratio = log_ratio.exp()
            if reference.message_weights is not None:
                # Drawn from μ, not old: E_{y~μ}[(old/μ)(new/old) Â] = E_{y~new}[Â], truncated.
                ratio = ratio * reference.message_weights
            for row, (e, _) in enumerate(batch.refs):
                episode_kl[e] += float(message_kl[row])
                # E_{y~old}[(new/old) Â] = E_{y~new}[Â]: the surrogate of Thm 3.4 per message.
                episode_gain[e] += float(ratio[row]) * rollouts.advantages[e]
        # The global batch, in rank order (a no-op in one process).
        episode_kl = self.collective.concatenate(episode_kl)
        episode_gain = self.collective.concatenate(episode_gain)
        weights = self.collective.concatenate(rollouts.episode_weights())
        turn_level_kl = (
            episode_kl / rollouts.horizon
        )  # E over the average occupancy d̄ = (1/H) Σ_t ρ_t
        mean = statistic_of(turn_level_kl, weights)
        quantile = statistic_of(turn_level_kl, weights, "quantile", self.settings.quantile)
        surrogate = float(np.sum(weights * episode_gain) / np.sum(weights))
        statistic = max(mean, quantile) if self.settings.statistic == "quantile" else mean
        return _Measurement(mean, quantile, surrogate, statistic)

    def _without_a_pass(
        self, team: LoraTeam, agent: int, rollouts: DialogueRollouts, n_tokens: int
    ) -> LoraUpdate | None:
        """The update when it needs no forward pass (else None): weights that overflowed
        (HAPPO), a batch without signal, an agent that never spoke."""
        together = self.collective
        unchanged = functools.partial(
            LoraUpdate,
            policy=team.agent(agent),
            surrogate=0.0,
            kl=0.0,
            advantage_bound=rollouts.a_max,
            tokens=n_tokens,
        )
        if together.any(not np.isfinite(rollouts.episode_weights()).all()):  # HAPPO overflow
            return unchanged(
                kl=math.nan, accepted=False, outcome=Outcome.NON_FINITE, non_finite="weights"
            )
        if not together.any(bool(np.any(rollouts.advantages * rollouts.episode_weights()))):
            # Every group's rewards were equal: the surrogate and its gradient are 0, so the
            # identity is the update (and its KL 0). Skipping it saves every forward pass.
            return unchanged(outcome=Outcome.NO_SIGNAL)
        if n_tokens == 0:
            return unchanged(outcome=Outcome.SILENT)
        return None

    # -- the AgentUpdater protocol -------------------------------------------------------------------
    def update(
        self, team: LoraTeam, agent: int, rollouts: DialogueRollouts, radius: float
    ) -> LoraUpdate:
        """Agent ``agent``'s trust-region update on ``rollouts`` (Thm 3.4): up to ``steps`` Adam
        steps, each shrunk until E_d̄[KL_i] (or its quantile) is at most ``radius``."""
        # 1. Updates that need no forward pass.
        n_tokens = int(self.collective.sum(message_tokens(self.chat, rollouts.episodes, agent)))
        weights = self.collective.concatenate(rollouts.episode_weights())
        sample_size = effective_sample_size(weights)
        unchanged = self._without_a_pass(team, agent, rollouts, n_tokens)
        if unchanged is not None:
            return replace(unchanged, effective_sample_size=sample_size)

        # 2. The pre-update policy on the batch: what every ratio and KL is measured against,
        #    and (reuse_work) the first step's gradient from the same pass; then the check that
        #    the rollouts are on-policy (the ratio is 1 before any step).
        backbone = team.backbone
        optimizer = self.optimizer_for(team, agent)
        before_update = ParameterSnapshot(list(backbone.parameters_of(agent).values()), optimizer)
        optimizer.zero_grad(set_to_none=True)
        # The behaviour log-probs first: where they are not recorded, the behaviour team's pass
        # computes them, and it must run before ``team`` is loaded into the shared backbone.
        behaviour = rollouts.behaviour_logps(agent, self.chat.policy)
        sampled = rollouts.recorded_logps(agent, self.chat.policy)  # where ``behaviour`` is them
        precision = weights_dtype(backbone.training_model(agent))
        cap = self._correction_cap(is_half(precision)) if sampled is not None else None
        reference = self._reference_pass(team, agent, rollouts, n_tokens, sampled, cap)
        mismatch = self._check_on_policy(
            agent, reference.chunks, behaviour, sampled is not None, precision, cap
        )
        backbone.mark_modified(agent)

        # 3. The trust-region steps, from where the step-size policy says.
        walk = self._steps(team, agent, rollouts, reference, radius)
        if walk.non_finite is not None:  # a NaN must not reach Adam's moments: back to the start
            before_update.restore()
        optimizer.zero_grad(set_to_none=True)
        scale = walk.step_size.after_update(walk.backtracks, walk.non_finite is not None)
        self._store_step_scale(optimizer, scale)

        # 4. The report.
        report = self._report(team, agent, rollouts.a_max, n_tokens, walk)
        return replace(report, effective_sample_size=sample_size, mismatch=mismatch)

    def _steps(
        self,
        team: LoraTeam,
        agent: int,
        rollouts: DialogueRollouts,
        reference: _ReferencePass,
        radius: float,
    ) -> _Walk:
        """Up to ``steps`` Adam steps, each starting where the last admitted one ended (with
        ``warm_start``, at the step size the previous update admitted) and shrunk into the
        region; a step that cannot be ends the walk at the last admitted iterate."""
        s = self.settings
        parameters = list(team.backbone.parameters_of(agent).values())
        accumulate_gradient = functools.partial(
            self._accumulate_gradient, team, agent, rollouts, reference.chunks, reference.n_tokens
        )
        measure = functools.partial(self._checked_measure, team, agent, rollouts, reference.chunks)
        walk = _Walk(
            StepSize(self.step_scale(team, agent), s.shrink, s.max_backtracks, s.warm_start)
        )
        walk.non_finite = reference.non_finite
        gradient = reference.first_gradient
        for _ in range(s.steps if walk.non_finite is None else 0):
            try:
                result = backtracked_step(
                    parameters,
                    self.optimizer_for(team, agent),
                    s.learning_rate,
                    accumulate_gradient,
                    measure,
                    operator.attrgetter("statistic"),
                    # No slack: the statistic admitted is the KL reported, never above delta_i
                    # (the stage loop then checks it with its own kl_tolerance).
                    TrustRegion(radius, tolerance=0.0),
                    shrink=s.shrink,
                    max_backtracks=s.max_backtracks,
                    initial_scale=walk.step_size.scale,
                    gradient=gradient,
                    reuse_gradient=self.reuse_work,
                )
            except NonFiniteUpdate as event:
                walk.non_finite = event.quantity
                break
            gradient = None  # the next step's gradient is at the new parameters
            walk.backtracks += result.backtracks
            if not result.accepted or result.candidate is None:
                walk.last_tried = result.statistic
                walk.step_size.on_reject()
                break
            walk.steps += 1
            walk.last = result.candidate
            walk.step_size.on_accept(result.step_scale)
        if walk.non_finite is not None:
            walk.last, walk.steps = None, 0
        return walk

    def _report(
        self, team: LoraTeam, agent: int, a_max: float, n_tokens: int, walk: _Walk
    ) -> LoraUpdate:
        """The update's result: the new policy where a step was admitted, else the old one."""
        backbone = team.backbone
        if walk.last is None:
            backbone.load(agent, team.agent(agent))  # bit-identical already; marks the slot
            return LoraUpdate(
                policy=team.agent(agent),
                surrogate=0.0,
                kl=walk.last_tried,
                advantage_bound=a_max,
                accepted=False,
                backtracks=walk.backtracks,
                outcome=Outcome.REJECTED if walk.non_finite is None else Outcome.NON_FINITE,
                non_finite=walk.non_finite,
                tokens=n_tokens,
            )
        return LoraUpdate(
            policy=backbone.snapshot(agent),
            surrogate=walk.last.surrogate,
            kl=walk.last.kl,
            advantage_bound=a_max,
            backtracks=walk.backtracks,
            kl_quantile=walk.last.kl_quantile,
            outcome=Outcome.STEPPED,
            tokens=n_tokens,
            steps=walk.steps,
        )


def _weighted_advantages(
    rollouts: DialogueRollouts,
    weights: np.ndarray,
    batch: MessageBatch,
    logps: torch.Tensor,
    sampled: dict[tuple[int, int], torch.Tensor] | None,
    cap: float | None,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Each message's advantage times its episode's weight; with a correction ``cap`` C, each
    token's further weighted by min(π/μ, C) against the ``sampled`` log-probs μ (truncated
    importance sampling, ``llm.update.mismatch``), and the messages' weights beside."""
    advantages = torch.tensor(
        [rollouts.advantages[e] * weights[e] for e, _ in batch.refs],
        dtype=torch.float32,
        device=logps.device,
    )
    if cap is None or sampled is None:
        return advantages, None
    recorded = laid_out(sampled, batch.refs, batch.mask)
    token_weights = truncated_weights(logps, recorded, batch.mask, cap)
    return (
        advantages.unsqueeze(-1) * token_weights,
        message_weights_of(logps, recorded, batch.mask, cap),
    )
