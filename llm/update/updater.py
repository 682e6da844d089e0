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
first step's gradient), and the check that the ratio is 1 there
(``llm.update.reference.check_on_policy``); (3) the trust-region steps (``_steps``,
``llm.update.steps``), one ``llm.update.backtracking.backtracked_step`` per Adam step, whose
gradient (``_accumulate_gradient``) and measurement (``_checked_measure``) are plain methods,
and whose step size one ``StepSize`` keeps; (4) the report (``_report``).

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
from dataclasses import replace

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
from llm.update.backtracking import ParameterSnapshot
from llm.update.outcome import LoraUpdate, Outcome, effective_sample_size
from llm.update.reference import Reference, ReferencePass, check_on_policy, weighted_advantages
from llm.update.steps import Measurement, NonFiniteUpdate, StepSize, Walk, take_steps
from teamtr.trust_region import statistic_of

STEP_SCALE_KEY = "teamtr_step_scale"
"""Optimiser param-group key holding the warm-started step size (saved with Adam's state)."""


def _finite(gradient: list[torch.Tensor | None]) -> bool:
    return all(g is None or bool(torch.isfinite(g).all()) for g in gradient)


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
    gets no gradient pass: its gradient is exactly 0 (``Reference.has_signal``; it is still
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
        self, batch: MessageBatch, reference: Reference, n_tokens: int, logps: torch.Tensor
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
    ) -> ReferencePass:
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
                advantages, message_weights = weighted_advantages(
                    rollouts, weights, batch, logps, sampled, cap
                )
                if not self.reuse_work:
                    chunks.append(Reference(chunk, batch, logps, advantages, None, message_weights))
                    continue
                detached = MessageBatch(batch.refs, batch.tokens, batch.mask, batch.logits.detach())
                reference = Reference(
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
            return ReferencePass(chunks, n_tokens, None, None)
        if self.collective.any(not finite_loss):
            return ReferencePass(chunks, n_tokens, None, "loss")
        gradient = self._taken_gradient(team, agent)
        return ReferencePass(chunks, n_tokens, gradient, None if _finite(gradient) else "gradient")

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

    def _accumulate_gradient(
        self,
        team: LoraTeam,
        agent: int,
        rollouts: DialogueRollouts,
        references: list[Reference],
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
        references: list[Reference],
    ) -> Measurement:
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
        references: list[Reference],
    ) -> Measurement:
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
        return Measurement(mean, quantile, surrogate, statistic)

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
        mismatch = check_on_policy(
            agent,
            reference.chunks,
            behaviour,
            sampled is not None,
            precision,
            cap,
            self.settings.ratio_tolerance,
            self.collective,
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
        reference: ReferencePass,
        radius: float,
    ) -> Walk:
        """Up to ``steps`` Adam steps from where the step-size policy says
        (``llm.update.steps.take_steps``), each measured on the whole batch."""
        s = self.settings
        parameters = list(team.backbone.parameters_of(agent).values())
        accumulate_gradient = functools.partial(
            self._accumulate_gradient, team, agent, rollouts, reference.chunks, reference.n_tokens
        )
        measure = functools.partial(self._checked_measure, team, agent, rollouts, reference.chunks)
        walk = Walk(
            StepSize(self.step_scale(team, agent), s.shrink, s.max_backtracks, s.warm_start)
        )
        walk.non_finite = reference.non_finite
        return take_steps(
            walk,
            parameters,
            self.optimizer_for(team, agent),
            s,
            accumulate_gradient,
            measure,
            radius,
            reference.first_gradient,
            reuse_gradient=self.reuse_work,
        )

    def _report(
        self, team: LoraTeam, agent: int, a_max: float, n_tokens: int, walk: Walk
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
