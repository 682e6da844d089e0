"""The vLLM engine against a real vLLM server (``make vllm``; skipped without ``.venv-vllm``).

A tiny Llama whose heads vLLM's CPU attention supports (``tiny:128x2``: 4 heads of 32), saved as
a folder and served by the engine's own environment. What is checked: the engine's log-probs
agree with the trainer's float32 forward pass, adapter versions are served exactly, also on
prompts whose cached key/value blocks an earlier version computed (and the pitfall that the new
name per version avoids is real), every update's mismatch stays within the float32 tolerance,
a replayed draw is the same tokens, the run's server refuses requests without the run's key,
dialogues are checked against the context the server serves, and a request the server refuses
mid-run is the engine fault that keeps the checkpoint, and coupled rows (a held-out pair's)
draw from their own seeds. The server's lifecycle and the probe of
a server at ``engine_url`` are in tests/llm/test_llm_engine_vllm_lifecycle.py.
"""

from __future__ import annotations

import math
import os
import re
import shutil
import stat
import sys
from dataclasses import replace
from pathlib import Path

import pytest
import torch
from llm_test_support import with_rewards

from llm.common.config import ConfigError, load_config, parse_override
from llm.conversation.dialogue import Episode
from llm.engines.protocol import EngineFailed, EngineUnavailable
from llm.engines.vllm.client import ENGINE_POSITIONS, VLLMEngine
from llm.engines.vllm.server_address import ServerRefused, served_models
from llm.models.adapter_folder import write_adapter
from llm.models.agents import AdapterWeights
from llm.models.loading import load_model, load_tokenizer
from llm.problems.tasks import Problem
from llm.training.builder import Components, build
from teamtr.config import StageConfig
from teamtr.penalty import EpisodicPenalty
from teamtr.stage import run_stage

REPO = Path(__file__).resolve().parents[2]
VLLM_PYTHON = Path(os.environ.get("TEAMTR_VLLM_PYTHON", REPO / ".venv-vllm" / "bin" / "python"))
TEAMTR = [sys.executable, "-m", "llm.interface.cli"]
TOLERANCE = 1e-4
"""``[updater] ratio_tolerance``: float32's, which the engine's log-probs must meet."""

PLUGIN_RAN = re.compile(r"teamtr_vllm_plugin: LoRA sum 'stochastic' in process (\d+)")
MODEL_LOADED = re.compile(r"\((\w+) pid=(\d+)\) INFO .*Starting to load model")
FORKED = re.compile(r"teamtr_vllm_plugin: engine core 'fork' in process (\d+)")
"""A server log's line from the process that loads the model (and runs it), named by vLLM."""

pytestmark = pytest.mark.skipif(
    not VLLM_PYTHON.is_file(), reason="no vLLM environment (`make vllm` builds .venv-vllm)"
)

CONFIG = """
[model]
source = "tiny:128x2"
[lora]
rank = 4
[team]
n_agents = 2
system_prompt = "Solve."
[task]
kind = "jsonl"
train_file = "{data}"
test_file = "{data}"
eval_size = 4
[sampler]
prompts_per_batch = 2
group_size = 4
turns = 2
max_new_tokens = 12
engine = "vllm"
[updater]
learning_rate = 1e-2
steps = 2
[stage]
radius = 0.05
update_order = "fixed"
stages = {stages}
[run]
output_dir = "{runs}"
dtype = "float32"
eval_every = 1
checkpoint_every = 1
threads = 1
"""


def write_config(directory: Path, stages: int = 1) -> Path:
    """A tiny team on a task whose answers are all "2": the random model says it now and then,
    so rewards differ within groups and updates really run (and check the engine)."""
    data = directory / "say_two.jsonl"
    data.write_text("".join(f'{{"question": "Say two ({i})", "answer": "2"}}\n' for i in range(20)))
    path = directory / "engine.toml"
    path.write_text(CONFIG.format(data=data, runs=directory / "runs", stages=stages))
    return path


def moved(weights: AdapterWeights, seed: int) -> AdapterWeights:
    """``weights`` with every LoRA B matrix random: a policy visibly away from the base."""
    generator = torch.Generator().manual_seed(seed)
    tensors = {
        name: (
            torch.randn(t.shape, generator=generator, dtype=t.dtype) * 0.3
            if "lora_B" in name
            else t
        )
        for name, t in weights.tensors.items()
    }
    return AdapterWeights(tensors)


@pytest.fixture(scope="module")
def served(tmp_path_factory) -> Components:
    """One server for the in-process tests of this module (it takes ~25 s to start)."""
    directory = tmp_path_factory.mktemp("served")
    parts = build(load_config(write_config(directory)), progress=False)
    assert isinstance(parts.sampler.engine, VLLMEngine)
    yield parts
    parts.sampler.close()


def engine_and_trainer_logps(parts: Components, team):
    """Per sampled message of ``team``: the engine's recorded log-probs and the trainer's."""
    rollouts = parts.sampler.sample(team)
    pairs = []
    for agent in range(team.n_agents):
        recorded = rollouts.recorded_logps(agent, parts.chat.policy)
        assert recorded, f"agent {agent} spoke no message with recorded log-probs"
        trainer = parts.sampler.agent_logps(team, rollouts.episodes, agent)
        pairs += [(recorded[key], trainer[key]) for key in recorded]
    return rollouts, pairs


def largest_gap(pairs) -> float:
    return max(float((a - b).abs().max()) for a, b in pairs if len(a))


def test_the_engines_log_probs_are_the_trainers_in_float32(served):
    team = served.team
    for policy in range(team.n_agents):  # two adapters, both away from the base, one batch
        team = team.with_agent(policy, moved(team.agent(policy), seed=policy + 1))
    _, pairs = engine_and_trainer_logps(served, team)
    tokens = sum(len(a) for a, _ in pairs)
    assert tokens >= 20
    assert largest_gap(pairs) <= TOLERANCE
    # The adapters matter: the base's own log-probs of the same tokens are far from them.
    rollouts = served.sampler.sample(team)
    base = served.sampler.agent_logps(served.team, rollouts.episodes, 0)
    recorded = rollouts.recorded_logps(0, served.chat.policy)
    assert max(float((recorded[k] - base[k]).abs().max()) for k in recorded) > 0.1


SERVER_BLOCK = 128
"""Tokens per key/value block of vLLM's CPU build: the prefix cache holds whole blocks only."""


def long_prompt_episodes(parts: Components) -> list[Episode]:
    """A group of episodes whose prompt is longer than one of the server's key/value blocks,
    so that every request on it finds that block in the prefix cache after the first."""
    question = " ".join(f"Say two ({i})." for i in range(40))
    prompt = tuple(parts.chat.encode_prompt(question))
    assert len(prompt) > SERVER_BLOCK + 1
    problem = Problem(question, "2")  # not drawn: the sampler's generator is left as it was
    return [Episode(problem, prompt, route_seed) for route_seed in range(4)]


def played_logps(parts: Components, team, episodes: list[Episode]):
    """The engine's recorded log-probs and the trainer's of ``episodes`` played by ``team``."""
    played, _ = parts.sampler.play(team, list(episodes), seed=7)
    pairs = []
    for agent in range(team.n_agents):
        trainer = parts.sampler.agent_logps(team, played, agent)
        recorded = {
            (e, t): turn.sampled_logps
            for e, episode in enumerate(played)
            for t, turn in enumerate(episode.turns)
            if parts.chat.policy(turn.agent) == agent and turn.message
        }
        pairs += [(recorded[key], trainer[key]) for key in recorded]
    return pairs


def test_each_new_adapter_version_is_served_exactly(served):
    """Each version of an agent is served with its own weights, also where its requests share
    whole key/value blocks with its predecessor's (the same long prompt, played by every
    version): an adapter name reused for a new version's files reads the blocks the old
    weights computed (vLLM #42125) and shows here as a log-prob gap."""
    team = served.team
    episodes = long_prompt_episodes(served)
    for seed in (11, 12, 13):  # three versions of agent 0 in turn, each under a new name
        team = team.with_agent(0, moved(team.agent(0), seed=seed))
        _, pairs = engine_and_trainer_logps(served, team)
        assert largest_gap(pairs) <= TOLERANCE
        assert largest_gap(played_logps(served, team, episodes)) <= TOLERANCE


def test_reusing_an_adapters_name_serves_its_old_weights(served, tmp_path):
    """The pitfall the engine's naming avoids: the same name (and path) loaded again with new
    weights keeps serving the old ones."""
    engine = served.sampler.engine
    assert isinstance(engine, VLLMEngine) and engine.address is not None
    model = served.team.backbone.model
    first = moved(served.team.agent(0), seed=21)
    second = moved(served.team.agent(0), seed=22)
    folder = tmp_path / "reused"
    context = served.chat.context(served.sampler.new_episodes(1)[0], 0)

    def served_logps(name: str) -> list[float]:
        body = {
            "model": name,
            "prompt": list(context),
            "max_tokens": 1,
            "temperature": 1.0,
            "seed": 0,
            "logprobs": 0,
            "echo": False,
        }
        answer = post("/v1/completions", body)
        return answer["choices"][0]["logprobs"]["top_logprobs"][0]

    def post(path: str, body: dict) -> dict:
        assert engine.address is not None
        return engine.address.request("POST", path, body, timeout=120)

    write_adapter(folder, model, 0, first)
    post("/v1/load_lora_adapter", {"lora_name": "reused", "lora_path": str(folder)})
    before = served_logps("reused")
    shutil.rmtree(folder)
    write_adapter(folder, model, 0, second)
    try:
        post("/v1/load_lora_adapter", {"lora_name": "reused", "lora_path": str(folder)})
    except ServerRefused:
        pass  # refused as already loaded: the old weights stay all the same
    post("/v1/load_lora_adapter", {"lora_name": "renamed", "lora_path": str(folder)})
    assert served_logps("reused") == before  # still the first weights
    assert served_logps("renamed") != before  # the second, under a name of its own


def test_the_runs_server_lets_in_only_requests_with_the_runs_key(served):
    """The server listens on a socket file in a folder only this user opens (no TCP port
    another process could hold first), and refuses every ``/v1`` request without the key
    drawn for the run: listing, drawing and loading an adapter alike."""
    address = served.sampler.engine.address
    assert address is not None and address.url.startswith("unix:")
    folder = Path(address.url.removeprefix("unix:")).parent
    assert stat.S_IMODE(folder.stat().st_mode) == 0o700
    draw = {"model": "base", "prompt": [1, 2, 3], "max_tokens": 1}
    load = {"lora_name": "anyones", "lora_path": str(folder)}
    for method, path, body in (
        ("GET", "/v1/models", None),
        ("POST", "/v1/completions", draw),
        ("POST", "/v1/load_lora_adapter", load),
    ):
        with pytest.raises(ServerRefused) as refused:
            address.request(method, path, body, timeout=60, keyed=False)
        assert refused.value.status == 401
    listed = served_models(address.request("GET", "/v1/models", timeout=60))
    assert ("base", str(served.sampler.engine.base)) in listed


def test_every_update_of_a_stage_checks_the_engine_within_float32(served):
    torch.manual_seed(0)
    report, _ = run_stage(
        served.team,
        served.sampler,
        served.updater,
        StageConfig(scheme="teamtr", radius=0.05, order="fixed"),
        EpisodicPenalty(served.config.sampler.turns),
    )
    measured = [r.update.mismatch for r in report.records if r.update.mismatch is not None]
    assert measured, "no update of the stage had a signal to check the engine with"
    assert all(m.max_gap <= TOLERANCE for m in measured)


@pytest.fixture
def served_bfloat16(tmp_path) -> Components:
    """The same team in bfloat16: a server started with ``--dtype bfloat16`` on a bfloat16
    base, stopped after its one test (two servers at once would need twice the memory)."""
    directory = tmp_path
    config = load_config(write_config(directory), [parse_override("run.dtype=bfloat16")])
    parts = build(config, progress=False)
    yield parts
    parts.sampler.close()


def test_in_bfloat16_the_engines_log_probs_are_checked_and_corrected_as_the_samplers(
    served_bfloat16,
):
    """Half precision through the engine: the record of μ and the truncated correction apply
    unchanged (``llm.update.mismatch``): the update measures the engine's log-probs against
    the trainer's, the KL within what bfloat16's rounding explains, and reweights the batch."""
    parts = served_bfloat16
    torch.manual_seed(0)
    rollouts = parts.sampler.sample(parts.team)
    rewards = [float(i % 2) for i in range(len(rollouts.episodes))]  # a signal in every group
    update = parts.updater.update(parts.team, 0, with_rewards(rollouts, rewards), radius=0.05)
    mismatch = update.mismatch
    assert mismatch is not None and mismatch.tokens > 0
    assert 0 < mismatch.kl <= mismatch.kl_tolerance < math.inf
    assert mismatch.max_gap > 0  # bfloat16 rounds: the engine and the trainer differ
    # The batch names what drew it: the server's sum is teamtr's plugin's, which its log shows
    # ran in the server's processes (the engine refuses a server whose log does not).
    assert rollouts.drawn_by == "vllm, bfloat16, LoRA sum stochastic"
    log = parts.sampler.engine.server.log.read_text()
    patched = {int(pid) for pid in PLUGIN_RAN.findall(log)}
    # The process that loads and runs the model is, on the CPU build, the engine core itself
    # (``cpu_build_environment``: no worker process of its own to start), forked from the API
    # server after the plugin patched it there (``engine_core_fork``): the patched classes are
    # the engine core's own, and a process vLLM spawned would have run the plugin again.
    ((process, pid),) = MODEL_LOADED.findall(log)
    (server,) = {int(found) for found in FORKED.findall(log)}
    assert process == "EngineCore" and int(pid) != server and patched == {server}, (
        process,
        pid,
        patched,
    )


def test_a_bfloat16_server_whose_vllm_lacks_the_plugin_is_refused(tmp_path, monkeypatch):
    """vLLM loads only the general plugins ``VLLM_PLUGINS`` names: a server told to load
    another one runs without teamtr's, as a vLLM without it installed would; the engine sees
    that in the server's log and refuses it, rather than sample a policy that lags each
    update (``llm.engines.vllm.engine_lora_sum.require_plugin``)."""
    monkeypatch.setenv("VLLM_PLUGINS", "lora_filesystem_resolver")
    config = load_config(write_config(tmp_path), [parse_override("run.dtype=bfloat16")])
    with pytest.raises(EngineUnavailable, match="no teamtr plugin"):
        build(config, progress=False)


def test_a_draw_replayed_with_its_seed_is_the_same_tokens(served):
    """What ``--resume`` rests on with the engine: the sampler's generator gives a replayed
    draw the same requests and seeds, and the engine draws the same tokens for them."""
    sampler = served.sampler
    episodes = sampler.new_episodes(2)
    first, _ = sampler.play(served.team, list(episodes), seed=123)
    again, _ = sampler.play(served.team, list(episodes), seed=123)
    other, _ = sampler.play(served.team, list(episodes), seed=124)
    messages = [[t.message for t in e.turns] for e in first]
    assert messages == [[t.message for t in e.turns] for e in again]
    assert messages != [[t.message for t in e.turns] for e in other]


def test_coupled_rows_send_their_own_seeds_and_draw_alike_in_any_batch(served):
    """A held-out pair's coupled dialogues (``TurnRequest.seeds``): vLLM seeds each request's
    generator with the row's seed and draws every step's race from it, so a row's tokens do not
    depend on the batch it comes in, and the same team continuing its dialogues from the
    second turn repeats them token for token (every pair 0), where other seeds do not."""
    sampler = served.sampler
    episodes = sampler.new_episodes(6, 1, coupled=True)
    first, _ = sampler.play(served.team, list(episodes), seed=1)
    alone, _ = sampler.play(served.team, [episodes[4], episodes[1]], seed=2)
    assert [e.turns for e in alone] == [first[4].turns, first[1].turns]
    cut, _ = sampler.cut_before(first, 1)
    again, _ = sampler.play(served.team, cut, seed=3)
    assert [e.turns for e in again] == [e.turns for e in first]
    reseeded = [replace(e, noise_seed=e.noise_seed + 1) for e in cut]
    other, _ = sampler.play(served.team, reseeded, seed=3)
    assert [e.turns for e in other] != [e.turns for e in first]


def test_dialogues_are_checked_against_the_context_the_server_serves(tmp_path):
    """One limit: the server is started for at most ``ENGINE_POSITIONS`` tokens, and the
    dialogue check before a run uses that limit, not the model's larger one (a dialogue
    between the two passed the check and failed mid-run). No server starts."""
    tokenizer = load_tokenizer("tiny:128x2")
    model = load_model("tiny:128x2", vocab_size=len(tokenizer))
    model.config.max_position_embeddings = 2 * ENGINE_POSITIONS
    model.save_pretrained(tmp_path / "long_model")
    tokenizer.save_pretrained(tmp_path / "long_model")
    lengths = [
        parse_override(f"model.source={tmp_path / 'long_model'}"),
        parse_override(f"sampler.max_new_tokens={ENGINE_POSITIONS // 2 + 100}"),
    ]
    config = load_config(write_config(tmp_path), lengths)
    with pytest.raises(ConfigError, match=f"serves contexts of {ENGINE_POSITIONS} tokens"):
        build(config, progress=False)
    in_process = load_config(
        write_config(tmp_path), [*lengths, parse_override("sampler.engine=hf")]
    )
    build(in_process, progress=False)  # the model's own positions hold the dialogues


class Notary:
    """A deterministic environment: after each message it says what it heard (shared), and
    after agent 0's tells agent 1 a private line."""

    def reset(self, problem, seed):
        from llm.problems.environment import Opening

        return Opening(f"{problem.question} (the notary listens)", {1: "only you see this"})

    def step(self, speaker, message):
        from llm.problems.environment import Reply

        private = {1: "psst, agent 1"} if speaker == 0 else {}
        return Reply(text=f"noted {len(message)} characters", private=private)


def test_environment_text_reaches_the_server_as_the_trainer_sees_it(served):
    """Dialogues with environment turns (shared and private text between the messages): the
    server's log-probs of every message are the trainer's within float32's tolerance, so the
    engine was given the same tokens, the environment's included, as each speaker's view."""
    import copy
    import dataclasses

    sampler = copy.copy(served.sampler)
    sampler.task = dataclasses.replace(sampler.task, environment=Notary)
    team = served.team
    for policy in range(team.n_agents):
        team = team.with_agent(policy, moved(team.agent(policy), seed=policy + 5))
    episodes = [sampler.open_episode(Problem("Say two", "2"), seed) for seed in range(4)]
    played, _ = sampler.play(team, episodes, seed=3)
    assert all(turn.replies for episode in played for turn in episode.turns)
    pairs = []
    for agent in range(team.n_agents):
        trainer = sampler.agent_logps(team, played, agent)
        pairs += [
            (turn.sampled_logps, trainer[(e, t)])
            for e, episode in enumerate(played)
            for t, turn in enumerate(episode.turns)
            if turn.agent == agent and turn.message
        ]
    assert sum(len(a) for a, _ in pairs) >= 10
    assert largest_gap(pairs) <= TOLERANCE


def test_a_request_the_server_refuses_is_the_fault_that_keeps_the_checkpoint(served):
    """HTTP 4xx mid-run (here the adapter the engine loaded, unloaded behind its back: 404) is
    ``EngineFailed``, an ``OSError``: the run saves its checkpoint, exits 1 and ``--resume``
    continues, as for a server that stopped (tests/llm/test_llm_engine_vllm_lifecycle.py).
    Last in the module: it leaves the engine without the adapter it thinks it has."""
    engine = served.sampler.engine
    assert isinstance(engine, VLLMEngine) and engine.address is not None
    team = served.team.with_agent(0, moved(served.team.agent(0), seed=31))
    served.sampler.sample(team)
    for name, _ in served_models(engine.address.request("GET", "/v1/models", timeout=60)):
        if name != "base":
            body = {"lora_name": name}
            engine.address.request("POST", "/v1/unload_lora_adapter", body, timeout=60)
    with pytest.raises(EngineFailed, match="refused /v1/completions: HTTP 404"):
        served.sampler.sample(team)
