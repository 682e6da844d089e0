"""The one body of a ``/v1/completions`` request the vLLM engine sends: a draw, or a probe.

Every request asks for the trained policy as the trainer computes it: pure sampling from
softmax(logits / T), with none of top-k, top-p, min-p or penalties (the server is started with
``--generation-config vllm``, so no model default adds any either), on token ids as teamtr
renders them. The tokenizer's end of text is ignored (``ignore_eos``): a message ends at the
chat's own stop token, or runs to its longest; no ``min_tokens`` is ever set, since vLLM's masks
the end-of-sequence token before the softmax and every returned log-prob would then be
log p - log(1 - p(eos)), not the policy's.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any


def completion_body(
    model: str,
    prompt: Sequence[int],
    max_tokens: int,
    temperature: float,
    *,
    seed: int | None = None,
    stop_id: int | None = None,
    logprobs: bool = False,
) -> dict[str, Any]:
    """At most ``max_tokens`` tokens after ``prompt`` from the adapter (or base) served as
    ``model``, drawn from softmax(logits / ``temperature``) (0: greedy) with the request's own
    ``seed`` (None: the server's); ``stop_id``: the token that ends a message (None: all
    ``max_tokens`` are drawn); ``logprobs``: each drawn token's log-prob under that softmax is
    returned (``--logprobs-mode processed_logprobs``). The answer carries the token ids."""
    body: dict[str, Any] = {
        "model": model,
        "prompt": list(prompt),
        "max_tokens": max_tokens,
        "temperature": temperature,
        "top_p": 1.0,
        "top_k": -1,
        "min_p": 0.0,
        "repetition_penalty": 1.0,
        "ignore_eos": True,
        "return_token_ids": True,
        "skip_special_tokens": False,
    }
    if seed is not None:
        body["seed"] = seed
    if stop_id is not None:
        body["stop_token_ids"] = [stop_id]
    if logprobs:
        body["logprobs"] = 0
    return body
