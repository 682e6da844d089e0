"""The settings of a run that live beside their components: LoRA, sampler, updater.

Every config dataclass ``llm.common.config`` assembles, in one module that imports no torch, peft or
transformers: reading and checking a config file (``teamtr train --check``) loads none of
them. The components import their settings from here (``llm.models.agents``, ``llm.sampling.sampler``,
``llm.update.updater`` re-export them under their old names).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

from llm.common.rules import check_section

if TYPE_CHECKING:
    from peft import LoraConfig


Estimator = Literal["exact", "k1", "k3"]
Direction = Literal["reverse", "forward"]
Draw = Literal["multinomial", "inverse_cdf"]
"""How a sampled token is drawn (``llm.engines.hf.draw``)."""
ESTIMATORS: tuple[str, ...] = ("exact", "k1", "k3")
DIRECTIONS: tuple[str, ...] = ("reverse", "forward")

DEFAULT_SYSTEM_PROMPT = (
    "Two assistants solve a math problem together. The first works it out; the second states "
    "the final answer as a number."
)
"""The default team's system prompt: the solver + answerer format, one of the two most accurate
team formats measured untrained (within a standard error of each other) (docs/teams_that_learn.md, "Team formats"; still below the single
agent at the same tokens)."""
DEFAULT_ROLE_PROMPTS = (
    "You are the solver. Work out the answer step by step.",
    "You are the answerer. Reply with only the final answer from the solver's work, as a number.",
)
DEFAULT_MESSAGE_TOKENS = (40, 8)
"""The default roles' longest messages: the solver's working, the answerer's number."""


@dataclass(frozen=True)
class LoraSettings:
    """LoRA hyper-parameters shared by every agent's adapter."""

    rank: int = 16
    """r, the rank of each low-rank update."""
    alpha: float = 32.0
    """lora_alpha; the update is scaled by alpha / r."""
    target_modules: str | tuple[str, ...] = "all-linear"
    """Which linear layers get an adapter ("all-linear": every one except the output head)."""
    half_precision_sum: Literal["float32", "round_once", "peft"] = "float32"
    """How an adapted layer of a bfloat16/float16 model adds s·B·A·x to W·x
    (``llm.models.half_precision_sum``): "float32", the half-precision product's output plus the
    branch, kept in float32; "round_once", both in float32, rounded once; "peft", PEFT's, which
    rounds W·x first and so loses a branch under half a unit of its last place. No effect in
    float32."""

    def __post_init__(self) -> None:
        check_section(self, "lora")

    def peft_config(self) -> LoraConfig:
        from peft import LoraConfig

        targets = (
            self.target_modules
            if isinstance(self.target_modules, str)
            else list(self.target_modules)
        )
        # Dropout is 0 so that the training forward pass is the sampling policy exactly:
        # ratios must be 1 before an update (the sampler's ratio check).
        return LoraConfig(
            r=self.rank,
            lora_alpha=self.alpha,  # type: ignore[arg-type]  # PEFT annotates int, uses alpha / r as a float
            lora_dropout=0.0,
            target_modules=targets,
            bias="none",
            task_type="CAUSAL_LM",
        )


@dataclass(frozen=True)
class SamplerSettings:
    """How many dialogues, how long, how random."""

    prompts_per_batch: int = 4
    """Distinct problems per rollout batch."""
    group_size: int = 8
    """G: dialogues per problem; advantages are normalised within each group (GRPO)."""
    turns: int = 2
    """H: turns per dialogue (the horizon of the turn-level episodic MDP)."""
    max_new_tokens: int | tuple[int, ...] = DEFAULT_MESSAGE_TOKENS
    """Longest message a speaker may write (a message cut here gets a stop token appended):
    one value for every speaker, or one per speaker (a solver that works it out, an answerer
    that states only the number)."""
    temperature: float = 0.7
    """The policy is softmax(logits / temperature), in sampling and in training alike."""
    a_max: float = 2.0
    """A_max: advantages are clipped to [-A_max, A_max] (the certificate's declared bound)."""
    score_chunk: int = 8
    """Episodes per training forward pass (memory/speed trade-off; no effect on results)."""
    signal_groups: int = 0
    """Dynamic sampling: the number of groups with differing rewards a batch should hold
    (at most ``prompts_per_batch``); the sampler draws further groups until it has found
    that many or drawn ``max_draws`` extra ones (see the module's docstring). 0: off, every
    batch is the ``prompts_per_batch`` groups drawn first, draw for draw."""
    max_draws: int = 16
    """With ``signal_groups`` > 0: the most groups a batch may draw beyond its
    ``prompts_per_batch`` (each a new problem played G times); every generated token counts."""
    held_out_group_size: int = 1
    """With ``[stage] certificate_groups`` > 0: dialogues per held-out problem, one pair of the
    measured certificate a problem (its dialogues' mean new reward minus mean old). 1: every
    held-out dialogue a problem of its own, the most pairs per generated token; the bounds'
    range term falls as 1/n, while a larger group narrows only their variance term
    (docs/measured_certificate.md)."""
    held_out_coupled: bool = True
    """With ``[stage] certificate_groups`` > 0: each held-out dialogue and its continuation by
    the updated team draw their tokens from common random numbers (a seed per dialogue and
    turn, ``llm.sampling.held_out_groups``), so that where the two teams agree the continuation
    repeats the dialogue and the pair is 0: the same mean, a smaller variance. False:
    independent noise."""
    merged_generation: bool = True
    """Generate with the speaker's adapter merged into a plain copy of the base model
    (``llm.models.generation``): the same policy up to float rounding, at the bare model's speed, for
    one extra base model of memory. False generates through the PEFT model (LoRA applied as
    an extra low-rank product in every adapted layer). Training log-probs are computed by the
    PEFT model either way."""
    behaviour_logps: Literal["sampled", "scored"] = "sampled"
    """Where the updater's on-policy check (``[updater] ratio_tolerance``) reads the behaviour
    log-probs from. "sampled": those the generating model drew each token with, recorded while
    sampling, which saves one forward pass over the batch per update; only where the model
    computes in float32 (their gap from the training pass is float32 rounding of two
    computations; measured in docs/stage_cost.md), elsewhere the pass runs.
    "scored": always that training forward pass. What the update computes is the same either
    way: the ratio's denominator is the pre-update pass, which the check compares against."""
    kept_contexts_mb: int = 2048
    """The most memory (MiB) the keys and values each speaker computed over its contexts may
    hold, kept for the next draw of the stage (``llm.engines.hf.context_cache``): after an
    update, an unchanged later speaker then reads only what was regenerated, not the prompt
    and kept turns again. The same samples up to float rounding; a call whose cache would
    exceed the limit is not kept (its contexts are read afresh next time). What they take a
    token and a stage: docs/stage_cost.md, "The unchanged speakers' keys and values". Only
    dialogues of 3 or more turns keep any. 0: off."""
    draw: Draw = "multinomial"
    """How engine "hf" draws a token from softmax(logits / T) (``llm.engines.hf.draw``): both
    exactly, with other random numbers. "multinomial": ``generate``'s own, one exponential
    variate per vocabulary entry (every earlier run's samples). "inverse_cdf": one uniform per
    row against the cumulative probabilities, less work a decoding step over a large vocabulary
    (measured in docs/scaling_out.md, "Half precision", "Is it faster?")."""
    engine: Literal["hf", "vllm"] = "hf"
    """What draws the messages (``llm.engines``): "hf", Hugging Face ``generate`` in
    this process; "vllm", a vLLM server (``make vllm``) holding the base once and one LoRA
    adapter per agent, started and stopped by teamtr unless ``engine_url`` names one. Either
    way the trainer checks every update against the log-probs the engine drew with."""
    engine_url: str = ""
    """With engine "vllm": the address of a vLLM server already running (``http://host:port``,
    started with ``--enable-lora``, run-time adapter loading, ``--logprobs-mode
    processed_logprobs`` and ``--generation-config vllm``; docs/scaling_out.md), checked by a
    probe before training (``llm.engines.vllm.probe``); empty: teamtr starts its own."""
    engine_key_variable: str = ""
    """With ``engine_url``: the environment variable that holds the key the server lets in
    (``VLLM_API_KEY`` in the server's environment); the key itself never goes in a config file
    or a run's records. A server teamtr starts gets a key of its own, drawn for the run."""
    engine_trusted_network: bool = False
    """With an ``engine_url`` of plain ``http://`` on another machine: whether the network
    between is trusted (a private link, a VPN). Unset, such a URL is refused: the key, every
    prompt and every adapter's path would cross it in clear (``https://``, a TLS proxy in
    front of vLLM, needs no trust)."""
    engine_args: str = ""
    """With engine "vllm": further arguments for the server teamtr starts (on a GPU shared
    with training, ``--gpu-memory-utilization 0.3``)."""
    engine_lora_sum: Literal["stochastic", "vllm"] = "stochastic"
    """With engine "vllm" in half precision: how the server's adapted layers add the LoRA
    branch to the base product's output. "stochastic": in float32, the sum rounded to the
    model's dtype stochastically (teamtr's vLLM plugin, ``vllm_plugin/``; unbiased, so the
    served policy keeps each update, where vLLM's own sum keeps a fraction of it: measured in
    docs/scaling_out.md); "vllm": vLLM's own sum, rounded to nearest, which loses an
    update's small first steps. A float32 server is the same either way."""
    seed: int = 0

    def __post_init__(self) -> None:
        check_section(self, "sampler")

    def max_tokens_of(self, speaker: int) -> int:
        """The longest message ``speaker`` may write."""
        if isinstance(self.max_new_tokens, tuple):
            return self.max_new_tokens[speaker]
        return self.max_new_tokens

    @property
    def longest_message(self) -> int:
        """The longest message any speaker may write."""
        if isinstance(self.max_new_tokens, tuple):
            return max(self.max_new_tokens)
        return self.max_new_tokens


@dataclass(frozen=True)
class UpdaterSettings:
    """Hyper-parameters of one agent update."""

    learning_rate: float = 2e-4
    """Adam step size before any backtracking."""
    steps: int = 2
    """Optimiser steps per update (full-batch; each one is checked against delta_i)."""
    clip_eps: float = 0.2
    """PPO clip range of the surrogate's ratio."""
    estimator: Estimator = "exact"
    """Per-token KL: "exact" over the vocabulary, or the sampled "k1"/"k3" estimators."""
    direction: Direction = "reverse"
    """"reverse" = KL(new || old), "forward" = KL(old || new)."""
    statistic: Literal["mean", "quantile"] = "mean"
    """Trust-region statistic: the mean E_d̄[KL] or, additionally, a quantile over episodes."""
    quantile: float = 0.9
    shrink: float = 0.5
    """Learning-rate factor per backtrack."""
    max_backtracks: int = 4
    """Backtracks per step before the step is abandoned."""
    ratio_tolerance: float = 1e-4
    """Largest |log new - log old| allowed before the first step (numerical noise only), on a
    float32 model; in half precision the check is on the sampler's mismatch KL per token, at
    a tolerance derived from the precision (``llm.update.mismatch.mismatch_kl_tolerance``)."""
    mismatch_correction: Literal["auto", "tis", "off"] = "auto"
    """How the update corrects for the sampler's policy μ differing from the trainer's π
    (``llm.update.mismatch``): "tis" weighs each token's surrogate term by
    min(π(y)/μ(y), tis_cap) (truncated importance sampling, Yao et al. 2025), "off" trains as if
    the tokens were drawn from π, "auto" is "tis" for a half-precision model and "off" in
    float32 (where μ = π to rounding, so float32 runs stay bit for bit what they were)."""
    tis_cap: float = 2.0
    """C, the truncation of the importance weights π/μ of ``mismatch_correction``."""
    warm_start: bool = True
    """Start each step at the agent's last admitted step size instead of ``learning_rate``
    (after an update that needed no backtrack, one ``1/shrink`` larger, up to
    ``learning_rate``). Every backtrack costs a forward and backward pass over the batch; a
    radius that admits only a fraction of ``learning_rate`` would otherwise pay for the same
    backtracks at every step. The step size is part of the optimiser state (checkpointed)."""

    def __post_init__(self) -> None:
        check_section(self, "updater")
