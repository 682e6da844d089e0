"""How a sampled token is drawn from softmax(logits / T): ``[sampler] draw``.

Both ways draw token i with probability p_i = softmax(z / T)_i, exactly as far as float32's p_i
go; they differ in the random numbers they use, so the same seed gives other samples.

- ``"multinomial"`` (the default): Hugging Face ``generate``'s own ``torch.multinomial(p, 1)``,
  which draws one exponential variate per vocabulary entry and row and takes argmax(p / q): a
  cost per decoding step that grows with the vocabulary, whatever the model's precision. Runs
  recorded before this setting existed reproduce only with it.
- ``"inverse_cdf"``: one float64 uniform u per row and the first token whose cumulative
  probability exceeds u times the total. The cumulative sums are float64 over float32
  probabilities, so each token's share of [0, total) is its p_i to about 1e-12 relative: the
  same distribution for one random number a row.

What either costs a step is measured in docs/scaling_out.md, "Half precision" ("Is it faster?",
with ``bench/sampling_draw.py``).

**Coupled rows** (``CoupledDraw``; a held-out pair's two sides,
``llm.sampling.held_out_groups``), whatever ``draw`` says: each row has a generator of its own, seeded with the row's seed, and at
every step draws one uniform u_i per vocabulary entry from it; the token is argmax_i p_i / E_i
with E_i = -log u_i, the first of independent exponential clocks of rates p_i to ring, which
is token i with probability p_i / sum p: an exact draw of softmax(logits / T) (the same pure
sampling at the policy's temperature, no top-k or top-p, as ``generate``'s), so the marginal
of each side of a pair is the engine's. A row's numbers depend on its seed and step alone, not
on its batch or context: two rows of one seed whose next-token distributions p and q are equal
draw the same token, and where they differ, the tokens differ with probability at most
2 TV / (1 + TV), TV their total variation (the Gumbel-max coupling; vLLM draws the same race
from a request's seed). Inverse CDF with one shared uniform a row and step would cost one
number instead of 49,152 (SmolLM2's vocabulary), but its tokens follow the vocabulary's order:
where mass moves between tokens on either side of a third, that third's draws move to its
neighbours, and where rewards alternate with token ids that can spread the pairs more than
independent noise does (docs/measured_certificate.md, "Coupled continuations on language
models"). The race's numbers cost what ``"multinomial"`` spends on every row anyway.

"""

from __future__ import annotations

from collections.abc import Sequence
from typing import get_args

import torch
from transformers import LogitsProcessor

from llm.common.settings import Draw

DRAWS: tuple[Draw, ...] = get_args(Draw)


def inverse_cdf_tokens(scaled_logits: torch.Tensor) -> torch.Tensor:
    """One token per row of ``scaled_logits`` (rows x vocabulary, logits / T), drawn with
    probability softmax(row): the first index whose float64 cumulative probability exceeds a
    uniform draw on [0, total)."""
    probabilities = torch.softmax(scaled_logits.float(), dim=-1)
    cumulative = probabilities.cumsum(dim=-1, dtype=torch.float64)
    # torch's global generator, which the sampler seeds for each play, as generate's draw.
    uniform = torch.rand(
        (scaled_logits.shape[0], 1), dtype=torch.float64, device=scaled_logits.device
    )
    # right=True: the first index whose cumulative probability is strictly above u, so a token
    # of probability 0 (its cumulative equal to its predecessor's) is never drawn; the clamp
    # covers u * total rounding up onto the total.
    tokens = torch.searchsorted(cumulative, uniform * cumulative[:, -1:], right=True)
    return tokens.clamp_(max=scaled_logits.shape[-1] - 1)


class InverseCdfDraw(LogitsProcessor):
    """``"inverse_cdf"`` inside ``generate``: it runs in greedy mode with this processor, which
    draws each row's token from softmax(logits / T) and hands back scores whose argmax is that
    token (0 there, -inf elsewhere). ``logps``, when a list is given, receives each step's
    log softmax(logits / T) at the drawn tokens (rows,), as sampling records them."""

    def __init__(self, temperature: float, logps: list[torch.Tensor] | None = None) -> None:
        if temperature <= 0:
            raise ValueError("inverse_cdf draws need a temperature above 0")
        self.temperature = temperature
        self.logps = logps

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        scaled = scores / self.temperature  # as generate's temperature warper computes it
        tokens = inverse_cdf_tokens(scaled)
        if self.logps is not None:
            self.logps.append(torch.log_softmax(scaled.float(), dim=-1).gather(-1, tokens)[:, 0])
        chosen = torch.full_like(scores, float("-inf"))
        return chosen.scatter_(1, tokens, 0.0)


def exponential_race_tokens(
    scaled_logits: torch.Tensor, generators: Sequence[torch.Generator]
) -> torch.Tensor:
    """One token per row of ``scaled_logits`` (rows x vocabulary, logits / T), drawn with
    probability softmax(row) from the row's generator: argmax_i p_i / E_i, E_i = -log u_i for
    float64 uniforms u_i on [0, 1) (u_i = 0 gives an entry that never wins, with probability
    2**-53 each)."""
    probabilities = torch.softmax(scaled_logits.float(), dim=-1).double()
    uniforms = torch.empty_like(probabilities)
    for row, generator in enumerate(generators):
        uniforms[row].uniform_(generator=generator)
    return (probabilities / -uniforms.log()).argmax(dim=-1, keepdim=True)


class CoupledDraw(LogitsProcessor):
    """Coupled rows inside ``generate`` (see the module): row r's tokens are the exponential
    race of a generator seeded with ``seeds[r]``, its numbers of step j the j-th block of that
    generator's stream. Greedy ``generate`` with this processor, as ``InverseCdfDraw``;
    ``logps`` receives each step's log softmax(logits / T) at the drawn tokens."""

    def __init__(
        self, temperature: float, seeds: Sequence[int], logps: list[torch.Tensor] | None = None
    ) -> None:
        if temperature <= 0:
            raise ValueError("coupled draws need a temperature above 0")
        self.temperature = temperature
        self.seeds = list(seeds)
        self.logps = logps
        self.generators: list[torch.Generator] | None = None

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        if self.generators is None:  # on the scores' device, at the first step
            self.generators = [
                torch.Generator(scores.device).manual_seed(seed) for seed in self.seeds
            ]
        scaled = scores / self.temperature  # as generate's temperature warper computes it
        tokens = exponential_race_tokens(scaled, self.generators)
        if self.logps is not None:
            self.logps.append(torch.log_softmax(scaled.float(), dim=-1).gather(-1, tokens)[:, 0])
        chosen = torch.full_like(scores, float("-inf"))
        return chosen.scatter_(1, tokens, 0.0)
