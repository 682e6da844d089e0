"""A server named by ``[sampler] engine_url`` proves it serves the run's policy before training.

teamtr did not start that server, so nothing it knows says which base, rank limit, dtype or
``--logprobs-mode`` it runs with; a wrong one would show only as rejected updates ("stale
rollouts?") once training began. Before the first stage, the engine therefore:

1. asks ``/v1/models`` with the key from the environment variable the config names
   (``[sampler] engine_key_variable``; the key itself is never in a config file or a run's
   records): refused (401) or no answer is said at once; and, where a key is named, the same
   request without it must be refused (401): a server started without ``VLLM_API_KEY`` in its
   environment lets everyone in, whatever key the run sends;
2. loads agent 0's adapter: a server whose ``--max-lora-rank`` is below the team's rank refuses
   it ("rank");
3. draws ``PROBE_TOKENS`` tokens of a fixed prompt at the run's temperature and compares the
   log-probs the server returns with those of the trainer's own forward pass (``diagnose``),
   asked as every request of the engine is (``llm.engines.vllm.completions``).

A server that already serves a trained team's adapters under names of their own (an export's
``agent0``, ...: ``check_served_adapters``) passes step 1, lists every name and answers the
same prompt greedily under each as the team's policy does.

Any disagreement is one ``EngineStartFailed`` naming the cause: the CLI's one ``error:`` line,
exit 2, before anything is written.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from typing import Any

import torch

from llm.common.devices import model_device
from llm.common.settings import SamplerSettings
from llm.conversation.dialogue import ChatFormat
from llm.engines.protocol import EngineFailed, EngineStartFailed, EngineUnavailable
from llm.engines.vllm.completions import completion_body
from llm.engines.vllm.server_address import ServerAddress, ServerRefused, served_models
from llm.models.agents import LoraTeam, is_half_precision

PROBE_QUESTION = "What is 2 + 3?"
PROBE_TOKENS = 8
PROBE_TIMEOUT = 600.0
"""How long a probe's request may take (seconds): a few tokens, on a server that is ready."""
SERVED_ARGMAX_MARGIN = 0.1
"""How far below the policy's argmax (in logits) a served greedy token may lie: a near tie that
a server computing in another order may break otherwise (``check_served_adapters``)."""
MATCH_TOLERANCE = {False: 1e-3, True: 0.5}
"""The largest log-prob gap (nats) on a probe token at which the server's policy is the
trainer's, by whether the team computes in half precision: far above float32's rounding, and
above what half precision's rounding moves one token by (both measured in docs/scaling_out.md,
"Rollouts on vLLM")."""
PRECISION_GAP = 0.1
"""A float32 team's probe gap below this (and above ``MATCH_TOLERANCE``): the same weights
computed in another precision (a server started with another ``--dtype``); above it, another
base model: above what another precision moves log-probs by (docs/scaling_out.md, "Rollouts on
vLLM")."""


def engine_key(settings: SamplerSettings) -> str | None:
    """The key of the server at ``engine_url``, read from the variable the config names."""
    variable = settings.engine_key_variable
    if not variable:
        return None
    key = os.environ.get(variable)
    if not key:
        raise EngineUnavailable(
            f"[sampler] engine_key_variable = {variable!r}: the environment has no {variable} "
            "(the key of the server at engine_url)"
        )
    return key


def check_served_policy(
    address: ServerAddress,
    load_adapter: Callable[[], str],
    team: LoraTeam,
    chat: ChatFormat,
    settings: SamplerSettings,
    rank: int,
) -> None:
    """The checks of the module's docstring; ``load_adapter`` loads agent 0's policy of
    ``team`` (LoRA rank ``rank``) into the server and returns its served name."""
    where = f"[sampler] engine_url = {address.url!r}"
    listed_models(address, settings, where)
    try:
        name = load_adapter()
    except EngineFailed as error:
        cause = "rank: its --max-lora-rank is below" if "max_lora_rank" in str(error) else "it"
        raise EngineStartFailed(
            f"{where}: {cause} refused the team's adapter (LoRA rank {rank}): {error}"
        ) from None
    prompt = list(chat.encode_prompt(PROBE_QUESTION))
    temperature = settings.temperature
    # All PROBE_TOKENS of them: no stop token (and ignore_eos, as every request).
    body = completion_body(name, prompt, PROBE_TOKENS, temperature, seed=0, logprobs=True)
    tokens, served = probe_answer(address, body, where)
    assert served is not None  # asked for
    model = team.use(0)
    trained = trainer_logps(model, prompt, tokens, temperature)
    unscaled = trainer_logps(model, prompt, tokens, 1.0)
    logits = trainer_logps(model, prompt, tokens, temperature, normalised=False)
    differs = diagnose(served, trained, unscaled, logits, is_half_precision(model))
    if differs is not None:
        raise EngineStartFailed(f"{where}: the server does not serve the run's policy: {differs}")


def check_served_adapters(
    address: ServerAddress,
    served: Sequence[str],
    team: LoraTeam,
    chat: ChatFormat,
    settings: SamplerSettings,
) -> None:
    """A server that serves ``team``'s policies under the names ``served`` (an export's
    ``agent0``, ...) lets the key in, lists every name, and under each answers the probe's
    question greedily as ``team``'s policy does: each of the ``PROBE_TOKENS`` tokens it plays
    is the policy's argmax, or within ``SERVED_ARGMAX_MARGIN`` of it (a near tie that a server
    computing in another order may break otherwise). Its log-probs are not held to the
    trainer's here (``check_served_policy``, the probe of a training run's own adapter, does
    that)."""
    where = f"[sampler] engine_url = {address.url!r}"
    listed = [name for name, _ in served_models(listed_models(address, settings, where))]
    if len(served) < team.n_agents or not set(served) <= set(listed):
        raise EngineStartFailed(
            f"{where}: the server serves {listed}, not the team's adapters "
            f"{list(served)} (serve them under these names: the export's vLLM line does)"
        )
    prompt = list(chat.encode_prompt(PROBE_QUESTION))
    for policy in range(team.n_agents):
        body = completion_body(served[policy], prompt, PROBE_TOKENS, 0.0)
        tokens, _ = probe_answer(address, body, where)
        logits = teacher_forced_logits(team.use(policy), prompt, tokens)
        chosen = logits.gather(-1, torch.tensor(tokens, device=logits.device)[:, None])[:, 0]
        margin = float((logits.max(-1).values - chosen).max())
        if margin > SERVED_ARGMAX_MARGIN:
            raise EngineStartFailed(
                f"{where}: the server's {served[policy]} does not answer as the team's "
                f"policy {policy}: a greedy token {margin:.3g} logits below its argmax"
            )


def listed_models(address: ServerAddress, settings: SamplerSettings, where: str) -> Any:
    """The server's ``/v1/models``, asked with the run's key. Refused (the key, or its lack)
    or no answer: ``EngineStartFailed`` naming which; where a key is sent, the same request
    without it must be refused too (``require_refused_without_key``)."""
    try:
        models = address.request("GET", "/v1/models", timeout=60)
    except ServerRefused as refused:
        variable = settings.engine_key_variable
        given = f"the key in {variable}" if variable else "a request without a key"
        raise EngineStartFailed(f"{where}: the server refuses {given}: {refused}") from None
    except OSError as error:
        raise EngineStartFailed(f"{where}: no vLLM server answers there ({error})") from None
    if address.key is not None:
        require_refused_without_key(address, where)
    return models


def probe_answer(
    address: ServerAddress, body: dict[str, Any], where: str
) -> tuple[list[int], torch.Tensor | None]:
    """The tokens the server draws for a probe's ``body``, and their log-probs where the body
    asks for them; a refused, failed or malformed answer: ``EngineStartFailed``."""
    try:
        choice = address.request("POST", "/v1/completions", body, timeout=PROBE_TIMEOUT)
        choice = choice["choices"][0]
        tokens = [int(t) for t in choice["token_ids"]]
        logps = choice["logprobs"]["token_logprobs"] if "logprobs" in body else None
        return tokens, None if logps is None else torch.tensor(logps, dtype=torch.float64)
    except (OSError, ServerRefused, KeyError, IndexError, TypeError, ValueError) as error:
        raise EngineStartFailed(f"{where}: the probe request failed: {error}") from None


def require_refused_without_key(address: ServerAddress, where: str) -> None:
    """``EngineStartFailed`` unless ``/v1/models`` asked without the key is refused (401)."""
    try:
        address.request("GET", "/v1/models", timeout=60, keyed=False)
    except ServerRefused as refused:
        if refused.status == 401:
            return
        status = f"HTTP {refused.status}"
    except OSError as error:
        status = f"no answer ({error})"
    else:
        status = "it answered /v1/models"
    raise EngineStartFailed(
        f"{where}: the server does not refuse requests without the key ({status}): start it "
        "with the key in VLLM_API_KEY in its environment"
    )


def teacher_forced_logits(
    model: torch.nn.Module, prompt: list[int], tokens: list[int]
) -> torch.Tensor:
    """(len(tokens), vocabulary), float64: the logits before each of ``tokens`` after
    ``prompt``, by the training model's own forward pass (on the model's device)."""
    ids = torch.tensor([prompt + tokens], device=model_device(model))
    with torch.no_grad():
        return model(input_ids=ids).logits[0, len(prompt) - 1 : -1].double()


def trainer_logps(
    model: torch.nn.Module,
    prompt: list[int],
    tokens: list[int],
    temperature: float,
    normalised: bool = True,
) -> torch.Tensor:
    """Each of ``tokens``' log-probs after ``prompt`` under log softmax(logits / T), by the
    training model's own forward pass (``normalised=False``: their logits / T)."""
    scaled = teacher_forced_logits(model, prompt, tokens) / temperature
    if normalised:
        scaled = torch.log_softmax(scaled, dim=-1)
    drawn = torch.tensor(tokens, device=scaled.device)[:, None]
    return scaled.gather(-1, drawn)[:, 0].cpu()


def diagnose(
    served: torch.Tensor,
    trained: torch.Tensor,
    unscaled: torch.Tensor,
    logits: torch.Tensor,
    half: bool,
) -> str | None:
    """None where the server's log-probs of the probe's tokens are the trainer's (within
    ``MATCH_TOLERANCE``), else the cause, named: the logprobs mode (``logits``, logits / T,
    in place of log-probs, or log-probs at temperature 1, ``unscaled``, in place of
    softmax(logits / T)), the dtype
    (a float32 team's gap below ``PRECISION_GAP``) or the base."""
    tolerance = MATCH_TOLERANCE[half]
    if served.shape != trained.shape:
        return f"base: {len(served)} log-probs for {len(trained)} tokens"
    gap = float((served - trained).abs().max())
    if gap <= tolerance:
        return None
    mode = "--logprobs-mode processed_logprobs"
    close_to_logits = float((served - logits).abs().max()) <= tolerance
    if close_to_logits or bool((served > 1e-6).any()):
        return f"logprobs mode: it returns logits, not log-probs (start it with {mode})"
    if float((served - unscaled).abs().max()) <= tolerance:
        return (
            "logprobs mode: its log-probs are at temperature 1, not of softmax(logits / T) "
            f"(start it with {mode})"
        )
    if not half and gap < PRECISION_GAP:
        return (
            f"dtype: its log-probs are {gap:.2g} nats from the trainer's, the same weights in "
            "another precision (start it with --dtype float32)"
        )
    return f"base: its log-probs are {gap:.2g} nats from the trainer's (another base model)"
