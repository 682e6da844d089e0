"""Helpers shared by the llm tests: tiny randomly initialised Llama teams (no download, seconds to build)."""

from __future__ import annotations

import dataclasses
import importlib.util
import math
import os
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterable, Sequence
from pathlib import Path
from types import ModuleType

import numpy as np
import torch

from llm.conversation.dialogue import ChatFormat, Episode
from llm.conversation.router import FixedOrder
from llm.logprobs.losses import group_normalised_advantages
from llm.models.agents import AdapterWeights, LoraBackbone, LoraSettings, LoraTeam
from llm.models.loading import tiny_llama
from llm.problems.tasks import ArithmeticSuite
from llm.sampling.rollouts import DialogueRollouts
from llm.sampling.sampler import DialogueSampler, SamplerSettings

SHORT_SYSTEM_PROMPT = "Solve."
REPO = Path(__file__).resolve().parents[2]
SMOKE = REPO / "llm" / "configs" / "smoke.toml"
"""The tiny smoke config: a random two-layer Llama with a character tokenizer, two stages."""
TEAMTR = Path(sys.executable).with_name("teamtr")
"""The ``teamtr`` console script of the interpreter running the tests."""


def teamtr(
    *arguments: str, cwd: Path = REPO, input: str | None = None, timeout: float = 600
) -> subprocess.CompletedProcess[str]:
    """The real ``teamtr ARGUMENTS`` (the console script) in a fresh process with one CPU
    thread, run from ``cwd`` with ``input`` on its standard input, its output captured."""
    return subprocess.run(
        [str(TEAMTR), *arguments],
        cwd=cwd,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
        input=input,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def load_bench(name: str) -> ModuleType:
    """``bench/<name>.py`` as a module (bench/ is a folder of scripts, not a package)."""
    spec = importlib.util.spec_from_file_location(name, REPO / "bench" / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def make_team(vocab_size: int, n_agents: int, seed: int = 0, rank: int = 4) -> LoraTeam:
    backbone = LoraBackbone.create(
        tiny_llama(vocab_size, seed=seed), n_agents, LoraSettings(rank=rank), seed=seed
    )
    return backbone.initial_team()


def perturb_agent(team: LoraTeam, agent: int, scale: float, seed: int) -> LoraTeam:
    """A team whose agent ``agent`` has random (non-zero) LoRA B matrices, N(0, scale²) each."""
    generator = torch.Generator().manual_seed(seed)
    tensors = {
        key: (torch.randn(value.shape, generator=generator) * scale if "lora_B" in key else value)
        for key, value in team.agent(agent).tensors.items()
    }
    return team.with_agent(agent, AdapterWeights(tensors))


def full_pass_logps(
    model: torch.nn.Module,
    chat: ChatFormat,
    episodes: Sequence[Episode],
    refs: Iterable[tuple[int, int]],
    temperature: float,
) -> dict[tuple[int, int], torch.Tensor]:
    """Each message ``refs`` names, scored by ``model`` (any causal LM: a PEFT model or the
    plain merged copy) in one forward pass over its transcript, in its speaker's view, up to
    the message's end: the token log-probs at ``temperature``, in float32."""
    out = {}
    with torch.no_grad():
        for e, t in refs:
            episode = episodes[e]
            ids, spans = chat.assemble(episode, chat.view_of(episode, episode.turns[t].agent))
            start, end = spans[t]
            logits = model(input_ids=torch.tensor([ids[:end]])).logits[0].float() / temperature
            log_probs = torch.log_softmax(logits[start - 1 : end - 1], dim=-1)
            out[(e, t)] = log_probs.gather(-1, torch.tensor(ids[start:end]).unsqueeze(-1))[:, 0]
    return out


def arithmetic_sampler(chat: ChatFormat, n_agents: int = 3, **overrides) -> DialogueSampler:
    suite = ArithmeticSuite(1)
    settings = SamplerSettings(
        **{"prompts_per_batch": 2, "group_size": 2, "turns": 3, "max_new_tokens": 6, **overrides}
    )
    return DialogueSampler(
        chat, FixedOrder(n_agents), lambda rng, n: suite.sample("train", n, rng), settings
    )


def with_rewards(rollouts: DialogueRollouts, rewards: list[float]) -> DialogueRollouts:
    """The same episodes graded differently: gives the updater a non-zero advantage signal."""
    r = np.asarray(rewards, dtype=float)
    advantages = group_normalised_advantages(
        torch.tensor(r), rollouts.group_size, rollouts.a_max
    ).numpy()
    return dataclasses.replace(rollouts, rewards=r, advantages=advantages)


TIMING_KEYS = ("wall_seconds", "sampling_seconds", "cpu_seconds")
"""A stage record's measured times: what two runs of the same computation need not share."""


def with_sampled_logps(
    rollouts: DialogueRollouts, episode: int, turn: int, logps: torch.Tensor
) -> DialogueRollouts:
    """The same rollouts with one turn's recorded sampling log-probs replaced."""
    turns = list(rollouts.episodes[episode].turns)
    turns[turn] = dataclasses.replace(turns[turn], sampled_logps=logps)
    episodes = list(rollouts.episodes)
    episodes[episode] = episodes[episode].with_turns(turns)
    return dataclasses.replace(rollouts, episodes=tuple(episodes))


class AlternatingRewards:
    """Wraps a sampler: its real rollouts graded 1, 0, 1, 0, ... so that every batch has reward
    variance (a tiny random model never solves a problem, and a batch without variance gives
    the updater no signal)."""

    def __init__(self, inner: DialogueSampler) -> None:
        self.inner = inner

    def sample(self, team, *, previous=None, updated_agent=None):
        rollouts = self.inner.sample(team, previous=previous, updated_agent=updated_agent)
        return with_rewards(rollouts, [float(i % 2 == 0) for i in range(len(rollouts.episodes))])

    def importance_weighted(self, rollouts, team):
        return self.inner.importance_weighted(rollouts, team)


# -- float32 resolution ------------------------------------------------------------------------
# Two float32 computations of one quantity that sum in another order (another batch shape, the
# prompt shared or not, gradients all-reduced, another kernel: ATEN_CPU_CAPABILITY=default, avx2,
# AVX-512) differ by rounding only. The tolerances below are that rounding, derived from float32's
# spacing; they are first-order estimates (worst-case sums of roundings), not measured fits.

FLOAT32_EPSILON = 2.0**-23
"""The spacing of float32 numbers at 1 (``torch.finfo(torch.float32).eps``)."""

FLOAT32_U = 2.0**-24
"""float32's unit roundoff: a rounding to nearest moves a value by at most this, relatively."""


def gamma(k: int, u: float = FLOAT32_U) -> float:
    """Higham's ``gamma_k = k u / (1 - k u)``: a computation in which every term passes through
    at most ``k`` roundings (the inner product of length ``k``: ``k - 1`` additions and the
    product's own, in ANY order or tree, with or without fused multiply-adds) is off its exact
    value by at most ``gamma_k`` times the sum of its terms' absolute values (Higham, Accuracy
    and Stability of Numerical Algorithms, Lemma 3.1 and (3.5)). The bound for tests that
    compare two kernels: a BLAS library promises no summation order, only the count.
    ``gamma_j + gamma_k + gamma_j gamma_k <= gamma_{j+k}`` (Lemma 3.3) composes stages."""
    if not k * u < 1:
        raise ValueError(f"gamma_{k} is undefined for u = {u}")
    return k * u / (1 - k * u)


def forward_sum_terms(config, positions: int, adapter_rank: int = 0) -> int:
    """How many float32 terms a Llama logit sums along its longest chain of sums.

    Per layer: the RMS norm (``hidden`` squares), the q/k/v projection (``hidden``), the attention
    score (``head_dim``) and the weighted sum over at most ``positions`` keys, the output
    projection (``hidden``), the second RMS norm (``hidden``), gate/up (``hidden``) and down
    (``intermediate``); then the final norm and the head (``hidden`` each). A LoRA adapter merged
    into a weight adds ``adapter_rank`` terms (B A) and one rounding (W + B A) to each of the
    seven adapted projections of a layer.
    """
    hidden, layers = config.hidden_size, config.num_hidden_layers
    head_dim = hidden // config.num_attention_heads
    per_layer = 6 * hidden + head_dim + positions + config.intermediate_size
    per_layer += 7 * (adapter_rank + 1) if adapter_rank else 0
    return layers * per_layer + 2 * hidden


def logit_resolution(config, positions: int, adapter_rank: int = 0) -> float:
    """How far two float32 forward passes may put one logit apart: ``eps`` per term summed.

    A sum of ``n`` float32 terms is off by at most ``n eps sum|terms|`` whatever the order. Every
    sum in the tiny Llama adds terms whose magnitudes add to at most about 1 (activations RMS-
    normalised to 1 times weights of std 0.02: ``sum|x_k w_k|`` is about ``0.016 n``, under 1 for
    the ``n <= 64`` terms of these models), and relative errors pass an RMS norm unchanged, so the
    errors along the chain add up to ``eps`` times its terms. Callers assert that the logits
    themselves stay below 1 (the premise).
    """
    return FLOAT32_EPSILON * forward_sum_terms(config, positions, adapter_rank)


def log_prob_resolution(config, positions: int, max_logit: float, temperature: float) -> float:
    """How far two float32 computations of one token log-probability may differ.

    ``log_softmax(z / T)`` over ``V`` entries is accurate to about ``V eps max|z| / T`` (its
    log-sum-exp sums ``V`` terms), and an error ``d`` in every logit moves a log-probability by at
    most ``2 d / T`` (the logit itself and the log-sum-exp).
    """
    vocabulary = config.vocab_size
    carried = 2 * logit_resolution(config, positions) / temperature
    return carried + vocabulary * FLOAT32_EPSILON * max_logit / temperature


def token_kl_resolution(vocabulary: int) -> float:
    """How far two float32 computations of one per-token KL may differ, whatever the KL.

    ``sum_v p_v (log p_v - log q_v)`` is a cross-entropy minus an entropy, each at most ``ln V``
    nats (the cross-entropy exceeds it only by the KL); resolved to ``eps`` of those magnitudes,
    the difference keeps an absolute error of ``eps * 2 ln V`` however small the KL is (as in
    ``tests/llm/test_llm_stage_profile.py``).
    """
    return FLOAT32_EPSILON * 2 * math.log(vocabulary)


def turn_kl_resolution(vocabulary: int, longest_message: int) -> float:
    """The same for a recorded (turn-level) KL: the agent's per-token KLs summed over its
    messages (at most ``longest_message`` tokens each, at most H of them) and divided by the H
    turns, i.e. at most ``longest_message`` per-token resolutions."""
    return token_kl_resolution(vocabulary) * longest_message


def surrogate_resolution(vocabulary: int, longest_message: int, a_max: float, turns: int) -> float:
    """How far two float32 computations of one recorded surrogate may differ.

    Each message contributes ``exp(sum_t (l_new - l_old)) * A``: a sum over at most
    ``longest_message`` tokens of two log-probabilities of the sampled token (``ln V`` on average:
    a sampled token's expected ``-log p`` is the entropy), each resolved to ``eps`` of itself,
    times ``|A| <= a_max`` (exp of a log-ratio near 0 is near 1), for each of the agent's at most
    H messages of an episode; the surrogate is a weighted mean over episodes.
    """
    return turn_kl_resolution(vocabulary, longest_message) * a_max * turns


def penalty_resolution(penalty: float, kl: float, kl_tolerance: float) -> float:
    """The tolerance of a penalty ``c sqrt(KL / 2)`` carried from its KL's: the square root
    taken at the lower end, where it is steepest."""
    if kl <= 0.0:
        return 0.0
    c = penalty / math.sqrt(kl / 2)
    return c * (math.sqrt(kl / 2) - math.sqrt(max(kl - kl_tolerance, 0.0) / 2))


def group_alive(group: int) -> bool:
    """Whether any process of process group ``group`` is still alive."""
    try:
        os.killpg(group, 0)
    except ProcessLookupError:
        return False
    return True


def wait_gone(group: int, timeout: float = 30) -> bool:
    """Wait up to ``timeout`` seconds for process group ``group`` to be gone."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not group_alive(group):
            return True
        time.sleep(0.1)
    return False


def free_port() -> int:
    """A TCP port of 127.0.0.1 that no process listens on now (a server a test starts on it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def healthy(url: str) -> bool:
    """Whether the server at ``url`` answers its ``/health`` route (vLLM's: 200 once ready)."""
    try:
        with urllib.request.urlopen(f"{url}/health", timeout=5) as response:
            return bool(response.status == 200)
    except (OSError, ValueError):
        return False


def teamtr_free_python(script: Path, *arguments: str) -> str:
    """Run ``script`` in a fresh interpreter, from the export's folder, and check that neither
    ``llm`` nor ``teamtr`` was loaded by it."""
    code = (
        "import runpy, sys; sys.argv = sys.argv[1:]; runpy.run_path(sys.argv[0], run_name='__main__');"
        "assert not {'llm', 'teamtr'} & set(sys.modules), 'the example imported teamtr'"
    )
    done = subprocess.run(
        [sys.executable, "-c", code, str(script), *arguments],
        cwd=arguments[0],
        env={**os.environ, "OMP_NUM_THREADS": "1"},
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout
