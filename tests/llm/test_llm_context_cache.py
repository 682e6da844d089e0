"""An unchanged speaker's kept keys and values (``[sampler] kept_contexts_mb``) sample what a fresh
prefill samples (llm.engines.hf.context_cache).

The tiny 3-agent team is resampled after agent 1's update, with and without the kept contexts,
from the same generator states: the messages must be the same token for token (a wrong key,
value or position changes the random model's distribution, and over the batch the samples), the
log-probs each token was drawn with equal up to float32 rounding, and the kept positions
exactly those a brute-force search of the previous draw's contexts finds. The chi-square test of
prefix reuse against the exact distribution (tests/llm/test_llm_prefix_reuse.py) runs with the
kept contexts on and checks there that they were read.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from llm_test_support import arithmetic_sampler, perturb_agent

from llm.common import profiling
from llm.engines.hf.context_cache import ContextCaches, ContextSource, SpeakerContexts

ROOT = Path(__file__).resolve().parents[2]
FLOAT_TOLERANCE = dict(rtol=1e-4, atol=1e-6)
"""float32 rounding of one forward pass run in other batch shapes (as in test_llm_stage_cost)."""


@pytest.fixture
def team(char_team):
    for agent in range(char_team.n_agents):  # non-zero adapters: every agent its own policy
        char_team = perturb_agent(char_team, agent, scale=0.3, seed=agent)
    return char_team


def resample_after_update(team, chat, keep: bool, signal_groups: int = 0):
    """The stage-start draw of ``team``, then the draw after agent 1's update, with the
    profile of the second."""
    sampler = arithmetic_sampler(
        chat,
        prompts_per_batch=2,
        group_size=4,
        temperature=1.0,
        signal_groups=signal_groups,
        **({} if keep else {"kept_contexts_mb": 0}),
    )
    torch.manual_seed(0)
    first = sampler.sample(team)
    updated = perturb_agent(team, 1, scale=0.5, seed=11)
    with profiling.recording() as profile:
        second = sampler.sample(updated, previous=first, updated_agent=1)
    return first, second, profile, sampler


def shared_length(a, b) -> int:
    length = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        length += 1
    return length


@pytest.mark.parametrize("signal_groups", [0, 2])
def test_kept_contexts_sample_what_a_fresh_prefill_samples(team, char_chat, signal_groups):
    first, kept, profile, sampler = resample_after_update(team, char_chat, True, signal_groups)
    _, plain, plain_profile, _ = resample_after_update(team, char_chat, False, signal_groups)
    for a, b in zip(kept.episodes, plain.episodes, strict=True):
        assert [t.message for t in a.turns] == [t.message for t in b.turns]
        for x, y in zip(a.turns, b.turns, strict=True):
            torch.testing.assert_close(x.sampled_logps, y.sampled_logps, **FLOAT_TOLERANCE)
    assert plain_profile.counts["kept context positions"] == 0

    # Agent 2, unchanged, speaks last: each of its rows continues from the longest prefix its
    # context shares with one it read in the first draw (all but its last token at most), when
    # longer than the prompt; the pool of a dynamic draw holds every group it played.
    read_before = [
        char_chat.context(e.with_turns(e.turns[:2]), 2) for e in (first.pool or first.episodes)
    ]
    expected = 0
    for episode in kept.pool or kept.episodes:
        context = char_chat.context(episode.with_turns(episode.turns[:2]), 2)
        longest = min(max(shared_length(context, old) for old in read_before), len(context) - 1)
        if longest > len(episode.prompt) - 1:
            expected += longest
    assert expected > 0
    assert profile.counts["kept context positions"] == expected
    assert sampler.engine.context_caches.size > 0 and sampler.engine.context_caches.held_bytes > 0
    if not signal_groups:
        # A draw that continues no other (a stage's first) starts from nothing: afterwards the
        # sampler holds its own contexts only, one per message generated.
        fresh = sampler.sample(kept.behaviour)
        assert sampler.engine.context_caches.size == sum(len(e.turns) for e in fresh.episodes)
    # A team in which every agent changed can read none of it: a draw of it lets it all go.
    sampler.engine.context_caches.new_draw([(k, -1 - k) for k in range(team.n_agents)])
    assert sampler.engine.context_caches.size == 0 and sampler.engine.context_caches.held_bytes == 0


def test_plays_outside_a_draw_keep_nothing_and_two_turns_keep_nothing(team, char_chat):
    sampler = arithmetic_sampler(char_chat, prompts_per_batch=2, group_size=2)
    sampler.play(team, sampler.new_episodes())  # as evaluation plays
    assert sampler.engine.context_caches.size == 0
    two_turns = arithmetic_sampler(char_chat, prompts_per_batch=2, group_size=2, turns=2)
    assert not two_turns.engine.keeps_contexts
    two_turns.sample(team)
    assert two_turns.engine.context_caches.size == 0


def source(row: int, positions: int = 3) -> ContextSource:
    """A kept context's source: row ``row`` of a one-layer cache of ``positions`` float32
    pairs (16 bytes a position for keys and values together)."""
    layers = ((torch.zeros(1, 1, positions, 2), torch.zeros(1, 1, positions, 2)),)
    return ContextSource(layers, row, torch.arange(positions))


def test_the_trie_finds_the_longest_shared_prefix_short_of_the_last_token():
    kept = SpeakerContexts()
    kept.keep([5, 6, 7, 8], source(0))
    kept.keep([5, 6, 9], source(1))
    length, found = kept.longest([5, 6, 7, 8, 1])
    assert (length, found.row) == (4, 0)
    length, found = kept.longest([5, 6, 9, 2])
    assert (length, found.row) == (3, 1)
    length, found = kept.longest([5, 6, 2])
    assert length == 2 and found.row in (0, 1)
    # A context read whole: one token is left for generation to run.
    assert kept.longest([5, 6, 7, 8])[0] == 3
    assert kept.longest([4, 6]) == (0, None)
    assert kept.size == 2


def test_a_draw_reads_the_last_one_and_keeps_only_its_own():
    caches = ContextCaches()
    caches.new_draw([(0, 10), (1, 20)])
    caches.keep((0, 10), [1, 2, 3], source(0))
    caches.keep((1, 20), [1, 2, 3], source(1))
    caches.end_draw()
    caches.new_draw([(0, 10), (1, 21)])  # agent 1 updated: its old snapshot can never speak
    assert caches.longest((0, 10), [1, 2, 3, 4])[0] == 3
    assert caches.longest((1, 20), [1, 2, 3, 4]) == (0, None)
    caches.keep((0, 10), [1, 2, 7], source(2))
    assert caches.longest((0, 10), [1, 2, 7, 4])[0] == 3  # the current draw's own, too
    caches.end_draw()
    # Between draws only the last draw's contexts are held.
    assert caches.size == 1
    assert caches.longest((0, 10), [1, 2, 3, 4])[0] == 2
    caches.new_draw([(0, 10), (1, 21)])
    caches.end_draw()
    assert caches.size == 0


def test_the_memory_limit_keeps_no_call_beyond_it():
    one_call = source(0, positions=4)  # 2 tensors of 8 float32: 64 bytes
    caches = ContextCaches(limit_bytes=100)
    caches.new_draw([(0, 10)])
    assert caches.admits(one_call.layers)
    caches.keep((0, 10), [1, 2, 3, 4], one_call)
    assert caches.held_bytes == 64
    assert caches.admits(one_call.layers)  # the same call's other rows: already held
    assert not caches.admits(source(1, positions=4).layers)  # 128 > 100


def test_the_benchmark_runs_a_stage_of_the_chain_with_and_without(tmp_path):
    """``bench/llm_kept_contexts.py --quick``: the same dialogues in every draw of a 3-agent
    chain stage, and kept positions read in the resamples only with the kept contexts on."""
    out = tmp_path / "kept.json"
    subprocess.run(
        [sys.executable, str(ROOT / "bench" / "llm_kept_contexts.py"), "--quick", "--agents", "3"]
        + ["--json", str(out)],
        check=True,
        cwd=ROOT,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
        capture_output=True,
    )
    report = json.loads(out.read_text())
    assert report["all_same_dialogues"] and len(report["draws"]) == 3
    assert all(draw["plain_kept_positions"] == 0 for draw in report["draws"])
    assert all(draw["plain_held_megabytes"] == 0 for draw in report["draws"])
    assert report["most_held_megabytes"] > 0
    assert all(draw["kept_kept_positions"] > 0 for draw in report["draws"][1:])
    assert all(
        draw["kept_generated_tokens"] == draw["plain_generated_tokens"] for draw in report["draws"]
    )
