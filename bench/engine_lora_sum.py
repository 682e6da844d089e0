"""Does the engine's policy carry the update? The share of float32's log-prob change that each
sampling engine keeps, for the same first-update adapters.

For each seed (the method and yardstick of ``bench/precision_diagnosis.py``): the config's team
is built in float32, one batch drawn, and each agent's first update (from B = 0) run on it by
the project's trust-region step. Every message token's log-prob is then computed under the base
and under each updated adapter, teacher-forced, at temperature 1, by:

- teamtr's own float32 forward pass: the reference change, adapter minus base, per token;
- the Hugging Face engine in bfloat16, with each ``[lora] half_precision_sum``;
- vLLM (``make vllm``), an offline engine per variant (``bench/vllm_prompt_logprobs.py``, one
  prompt a request; on the CPU build one process a sum, its dtypes' engines one after
  another): float32, and bfloat16 with vLLM's own sum and with teamtr's plugin's stochastic
  sum (``TEAMTR_VLLM_LORA_SUM``, ``vllm_plugin/``); float16 too where asked
  (``--vllm-dtypes``; on a GPU, ``bench/gpu_check.sh``).

Reported per variant and agent: the share of float32's change it keeps (the projection
<change, float32's> / <float32's, float32's>: 1 = all of it, 0 = none) and the cosine (what is
left is rounding noise, orthogonal to the change). The base alone is compared too (mean and
largest |Δ log-prob| against float32's base).

Each share comes with its standard error over the messages (``kept_se_messages``). A
half-precision engine's change differs from float32's by rounding noise of a size of its own,
not of the update's: on the tiny model, vLLM's bfloat16 with the plugin leaves a residual of
0.9e-3 to 1.4e-3 nats a token for updates whose change ranges from 0.25e-3 to 20e-3 a token,
and most of it is deterministic (the rounding of everything else the bfloat16 model computes,
on a changed input), which repeated passes of the stochastic sum do not average away. The
projection is unbiased (its denominator, float32's change, is exact), but its error is that
noise's projection, large where the change is small. The error is estimated from the residual,
message by message (a rounding carries to the message's later tokens through the cache): every
error that is not the change counts, the stochastic sum's draws and the deterministic rounding
alike. ``kept_se`` is the repeats' own standard error: the draws' part only.

Usage (one thread; about 10 CPU-minutes a seed for the default relay on SmolLM2)::

    OMP_NUM_THREADS=1 .venv/bin/python bench/engine_lora_sum.py --config default \\
        --seeds 0 6 --json results/engine_lora_sum.json
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import statistics
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

import torch
from precision_diagnosis import build_variant, cosine, rebound

from llm.common.config import RunConfig, load_config
from llm.conversation.dialogue import Episode
from llm.engines.vllm.command import vllm_rank
from llm.engines.vllm.installation import is_cpu_build, vllm_python
from llm.logprobs.scoring import score_chunks, turns_of
from llm.models.adapter_folder import write_adapter
from llm.models.agents import AdapterWeights, LoraTeam
from llm.models.base_folder import base_folder
from llm.models.loading import load_tokenizer
from llm.sampling.rollouts import DialogueRollouts
from llm.training.builder import Components

HF_VARIANTS = {
    "hf bfloat16, PEFT's sum": "bfloat16",
    "hf bfloat16, round once": "bf16-round-once",
    "hf bfloat16, float32 sum (default)": "bf16-float32-sum",
}
"""The Hugging Face engine's variants: ``bench/precision_diagnosis.py``'s names."""
VLLM_SUMS = {"vllm": "vLLM's sum", "stochastic": "stochastic sum (teamtr's plugin)"}
ROOT = Path(__file__).resolve().parents[1]
Ref = tuple[int, int]


def message_refs(parts: Components, episodes: tuple[Episode, ...], agent: int) -> list[Ref]:
    return turns_of(parts.chat, episodes, agent, range(len(episodes)))


def teacher_forced(
    parts: Components, team: LoraTeam, episodes: tuple[Episode, ...], agent: int
) -> dict[Ref, torch.Tensor]:
    """``agent``'s message tokens' log-probs under ``team`` by teamtr's forward pass, at T = 1."""
    out: dict[Ref, torch.Tensor] = {}
    with torch.no_grad():
        model = team.use(agent)
        for _, batch in score_chunks(model, parts.chat, episodes, agent, 8, 1.0):
            logps = batch.token_logps()
            for row, ref in enumerate(batch.refs):
                out[ref] = logps[row][batch.mask[row]].double()
    parts.team.activate()
    return out


def flat(values: dict[Ref, torch.Tensor] | dict[Ref, list[float]], refs: list[Ref]) -> torch.Tensor:
    return torch.cat([torch.as_tensor(values[ref], dtype=torch.float64) for ref in refs])


def share_kept(change: torch.Tensor, wanted: torch.Tensor, lengths: list[int]) -> dict[str, float]:
    """The share of ``wanted`` (float32's change) that ``change`` keeps, its cosine, and the
    share's standard error over the messages (``lengths``: each message's tokens, in order)."""
    if not float(wanted @ wanted) > 0:
        raise ValueError(
            "an agent's first update did not move its policy (no reward signal in the batch, or"
            " the update was rejected): nothing to keep; another seed or a larger batch"
        )
    kept = float(change @ wanted) / float(wanted @ wanted)
    return {
        "kept": kept,
        "kept_se_messages": message_se(change - kept * wanted, wanted, lengths),
        "cosine": cosine(change, wanted),
    }


def message_se(residual: torch.Tensor, wanted: torch.Tensor, lengths: list[int]) -> float:
    """The standard error of the projection <change, wanted> / <wanted, wanted> from the
    ``residual`` (change minus its fitted part), clustered by message: the rounding noise of one
    token is carried to the message's later ones through the cache, so messages, not tokens, are
    the independent draws. The sandwich estimate with the small-sample factor G / (G - 1) of G
    messages; infinite with one message (no spread to measure)."""
    messages = len(lengths)
    if messages < 2:
        return math.inf
    terms = torch.stack(
        [
            w @ r
            for w, r in zip(
                torch.split(wanted, lengths), torch.split(residual, lengths), strict=True
            )
        ]
    )
    spread = float(terms.pow(2).sum()) * messages / (messages - 1)
    return math.sqrt(spread) / float(wanted @ wanted)


def vllm_prompts(
    parts: Components, episodes: tuple[Episode, ...], refs_of: dict[int, list[Ref]], repeats: int
) -> list[dict[str, Any]]:
    """One request per message and model (the base, then the agent's adapter ``repeats`` times):
    its transcript in its speaker's view up to the message's end, and the positions of the
    message's tokens."""
    prompts = []
    for agent, refs in refs_of.items():
        for adapter, copies in ((None, 1), (f"agent{agent}", repeats)):
            for copy in range(copies):
                for e, t in refs:
                    view = parts.chat.view_of(episodes[e], episodes[e].turns[t].agent)
                    ids, spans = parts.chat.assemble(episodes[e], view)
                    start, end = spans[t]
                    prompts.append(
                        {
                            "agent": agent,
                            "ref": [e, t],
                            "adapter": adapter,
                            "copy": copy,
                            "ids": ids[:end],
                            "positions": list(range(start, end)),
                        }
                    )
    return prompts


PLUGIN_LINE = re.compile(r"teamtr_vllm_plugin: LoRA sum 'stochastic' in process (\d+)")


def run_vllm(
    job: dict[str, Any], prompts: dict[str, list[dict[str, Any]]], lora_sum: str, work: Path
) -> dict[str, dict[str, Any]]:
    """Each dtype's engine with ``lora_sum``, one after another in one vLLM process (the plugin
    is loaded once a process, by vLLM): per dtype its answer, with the process's wall seconds
    and the processes the plugin's line names."""
    path = work / f"job-{lora_sum}-{'-'.join(prompts)}.json"
    path.write_text(
        json.dumps({**job, "engines": [{"dtype": d, "prompts": prompts[d]} for d in prompts]})
    )
    out = path.with_name(path.name.replace("job-", "vllm-"))
    environment = {**os.environ, "TEAMTR_VLLM_LORA_SUM": lora_sum}
    environment.pop("PYTHONPATH", None)  # teamtr's packages must not shadow vLLM's
    started = time.monotonic()
    command = [str(vllm_python()), str(ROOT / "bench" / "vllm_prompt_logprobs.py")]
    result = subprocess.run(
        [*command, str(path), str(out)], env=environment, capture_output=True, text=True
    )
    if result.returncode != 0:
        raise RuntimeError(
            f"vLLM ({', '.join(prompts)}, {lora_sum}) failed:\n{result.stderr[-3000:]}"
        )
    wall = time.monotonic() - started
    # The processes the plugin patched (every vLLM process, the model's among them).
    patched = sorted({int(pid) for pid in PLUGIN_LINE.findall(result.stdout + result.stderr)})
    engines = json.loads(out.read_text())["engines"]
    return {
        dtype: {**answer, "wall_seconds": wall, "plugin_processes": patched}
        for dtype, answer in zip(prompts, engines, strict=True)
    }


def engine_row(
    prompts: list[dict[str, Any]],
    answer: dict[str, Any],
    refs_of: dict[int, list[Ref]],
    lengths: dict[int, list[int]],
    wanted: dict[int, torch.Tensor],
    float32_base: dict[int, torch.Tensor],
    residuals: dict[int, torch.Tensor] | None = None,
) -> dict[str, Any]:
    """Per agent: the share of float32's change kept by the mean change over the adapter's
    repeats (the mean of the repeats' shares), its standard error over the messages and over the
    repeats, the repeats' mean cosine, and the engine's base against float32's. ``residuals``,
    where given, receives each agent's mean change minus its fitted part (for ``paired``)."""
    values: dict[tuple[int, str | None, int], dict[Ref, list[float]]] = {}
    for prompt, logps in zip(prompts, answer["logprobs"], strict=True):
        key = (prompt["agent"], prompt["adapter"], prompt["copy"])
        values.setdefault(key, {})[(prompt["ref"][0], prompt["ref"][1])] = logps
    row: dict[str, Any] = {}
    for agent, refs in refs_of.items():
        engine_base = flat(values[(agent, None, 0)], refs)
        repeats = [key for key in values if key[:2] == (agent, f"agent{agent}")]
        changes = [flat(values[key], refs) - engine_base for key in repeats]
        shares = [share_kept(change, wanted[agent], lengths[agent]) for change in changes]
        kept = [share["kept"] for share in shares]
        mean_change = torch.stack(changes).mean(0)
        mean = share_kept(mean_change, wanted[agent], lengths[agent])
        if residuals is not None:
            residuals[agent] = mean_change - mean["kept"] * wanted[agent]
        gap = (engine_base - float32_base[agent]).abs()
        row[str(agent)] = {
            "kept": mean["kept"],
            "kept_se_messages": mean["kept_se_messages"],
            "messages": len(refs),
            "kept_se": statistics.stdev(kept) / math.sqrt(len(kept)) if len(kept) > 1 else 0.0,
            "kept_repeats": kept,
            "cosine": statistics.fmean(share["cosine"] for share in shares),
            "base_gap_mean": float(gap.mean()),
            "base_gap_max": float(gap.max()),
        }
    return row


def paired(
    row: dict[str, Any],
    residuals: dict[int, torch.Tensor],
    other: dict[str, Any],
    other_residuals: dict[int, torch.Tensor],
    wanted: dict[int, torch.Tensor],
    lengths: dict[int, list[int]],
) -> dict[str, dict[str, float]]:
    """Per agent: how much more of float32's change ``row``'s engine keeps than ``other``'s on
    the same tokens, and that difference's standard error over the messages. Two engines of one
    dtype round the same base activations, so much of their rounding noise is shared (the
    plugin's residual and vLLM's sum's point the same way, cosine 0.4 to 0.7 on the tiny
    model): the difference is measured more sharply than either share."""
    return {
        str(agent): {
            "gain": row[str(agent)]["kept"] - other[str(agent)]["kept"],
            "gain_se_messages": message_se(
                residual - other_residuals[agent], wanted[agent], lengths[agent]
            ),
        }
        for agent, residual in residuals.items()
    }


def first_updates(
    parts: Components, rollouts: DialogueRollouts, radius: float, scale: float, log
) -> dict[int, AdapterWeights]:
    """Each agent's first update on the batch from the same start, its B scaled by ``scale``
    (1: as trained; the tests shrink a tiny model's large first steps to SmolLM2's size)."""
    updated = {}
    for agent in range(parts.team.n_agents):
        update = parts.updater.update(parts.team, agent, rollouts, radius)
        tensors = {
            key: tensor * scale if "lora_B" in key else tensor.clone()
            for key, tensor in update.policy.tensors.items()
        }
        updated[agent] = AdapterWeights(tensors)
        log(f"agent {agent}: first update KL {update.kl:.4f}, B scaled by {scale:g}")
    return updated


def one_seed(base: RunConfig, seed: int, args: argparse.Namespace, log) -> dict[str, Any]:
    started = time.process_time()
    parts = build_variant(base, "float32", seed)
    torch.manual_seed(seed)
    rollouts = rebound(parts.sampler.sample(parts.team), parts)
    episodes = rollouts.episodes
    n_agents = parts.team.n_agents
    log(f"seed {seed}: {len(episodes)} dialogues")
    updated = first_updates(parts, rollouts, base.stage.radius, args.scale_update, log)
    refs_of = {agent: message_refs(parts, episodes, agent) for agent in range(n_agents)}

    def changes(variant_parts: Components) -> dict[int, torch.Tensor]:
        out = {}
        for agent, refs in refs_of.items():
            before = teacher_forced(variant_parts, variant_parts.team, episodes, agent)
            moved = variant_parts.team.with_agent(agent, updated[agent])
            after = teacher_forced(variant_parts, moved, episodes, agent)
            out[agent] = flat(after, refs) - flat(before, refs)
        return out

    wanted = changes(parts)
    float32_base = {
        agent: flat(teacher_forced(parts, parts.team, episodes, agent), refs)
        for agent, refs in refs_of.items()
    }
    lengths = {
        agent: [len(episodes[e].turns[t].message) for e, t in refs]
        for agent, refs in refs_of.items()
    }
    rows: dict[str, dict[str, Any]] = {}
    for label, variant in HF_VARIANTS.items():
        got = changes(build_variant(base, variant, seed))
        rows[label] = {str(a): share_kept(got[a], wanted[a], lengths[a]) for a in range(n_agents)}
        log(f"  {label}: {describe(rows[label])}")
    with tempfile.TemporaryDirectory(prefix="teamtr-lora-sum-") as temporary:
        work = Path(temporary)
        tokenizer = load_tokenizer(base.model.source)
        folder = base_folder(parts.team.backbone.model, tokenizer, cache=work / "cache")
        adapters = {}
        for agent in range(n_agents):
            adapters[f"agent{agent}"] = str(work / f"agent{agent}")
            model = parts.team.backbone.model
            write_adapter(Path(adapters[f"agent{agent}"]), model, agent, updated[agent])
        job = {
            "base": str(folder),
            "adapters": adapters,
            "max_lora_rank": vllm_rank(base.lora.rank),
        }
        answers: dict[tuple[str, str], dict[str, Any]] = {}
        prompts: dict[tuple[str, str], list[dict[str, Any]]] = {}
        # On the CPU build every dtype's engine in one process; on a GPU one engine a process,
        # so that each engine finds the device's memory as the one before found it.
        cpu = is_cpu_build(vllm_python())
        groups = [args.vllm_dtypes] if cpu else [[dtype] for dtype in args.vllm_dtypes]
        for lora_sum in VLLM_SUMS:
            # float32: vLLM's sum is exact already; the plugin's is run too, to show it changes
            # nothing there (the float32 logprobs compared bit for bit).
            for dtype in args.vllm_dtypes:
                repeats = args.repeats if (dtype != "float32" and lora_sum == "stochastic") else 1
                prompts[(dtype, lora_sum)] = vllm_prompts(parts, episodes, refs_of, repeats)
            for group in groups:
                by_dtype = {dtype: prompts[(dtype, lora_sum)] for dtype in group}
                for dtype, answer in run_vllm(job, by_dtype, lora_sum, work).items():
                    answers[(dtype, lora_sum)] = answer
        for dtype in args.vllm_dtypes:
            residuals: dict[str, dict[int, torch.Tensor]] = {}
            for lora_sum in VLLM_SUMS:
                answer = answers[(dtype, lora_sum)]
                label = f"vllm {dtype}, {VLLM_SUMS[lora_sum]}"
                residuals[lora_sum] = {}
                rows[label] = {
                    **engine_row(
                        prompts[(dtype, lora_sum)],
                        answer,
                        refs_of,
                        lengths,
                        wanted,
                        float32_base,
                        residuals[lora_sum],
                    ),
                    "seconds": answer["seconds"],
                    "wall_seconds": answer["wall_seconds"],  # of the process of every dtype
                    "plugin_processes": answer["plugin_processes"],
                    # Where the model computed, and whether its LoRA layers' sum was the plugin's.
                    "model_sum": answer["model_sum"],
                }
                log(f"  {label}: {describe(rows[label])} ({answer['seconds']:.0f} s of prompts)")
            # The plugin's share against vLLM's own sum's, paired on the same tokens.
            plugin, plain = (f"vllm {dtype}, {VLLM_SUMS[s]}" for s in ("stochastic", "vllm"))
            rows[plugin]["over_vllm_sum"] = paired(
                rows[plugin],
                residuals["stochastic"],
                rows[plain],
                residuals["vllm"],
                wanted,
                lengths,
            )
            gains = rows[plugin]["over_vllm_sum"].items()
            log(
                f"  vllm {dtype}, the plugin over vLLM's sum: "
                + ", ".join(
                    f"agent {a} {g['gain']:+.3f} ± {g['gain_se_messages']:.3f}" for a, g in gains
                )
            )
    float32_untouched = None
    if ("float32", "vllm") in answers and ("float32", "stochastic") in answers:
        float32_untouched = (
            answers[("float32", "vllm")]["logprobs"]
            == answers[("float32", "stochastic")]["logprobs"]
        )
    return {
        "seed": seed,
        "scale_update": args.scale_update,
        "tokens": {
            str(a): sum(len(episodes[e].turns[t].message) for e, t in refs)
            for a, refs in refs_of.items()
        },
        "dialogues": len(episodes),
        "float32_change_norm": {str(a): float(wanted[a].norm()) for a in wanted},
        "float32_untouched_by_plugin": float32_untouched,
        "variants": rows,
        "cpu_seconds": time.process_time() - started,
    }


def describe(row: dict[str, Any]) -> str:
    return ", ".join(
        f"agent {a} kept {r['kept']:.3f} ± {r['kept_se_messages']:.3f} (cos {r['cosine']:.3f})"
        for a, r in row.items()
        if a.isdigit()
    )


def markdown(seeds: list[dict[str, Any]]) -> str:
    labels = list(seeds[0]["variants"])
    header = " | ".join(
        f"seed {s['seed']}: agent {a}"
        for s in seeds
        for a in s["variants"][labels[0]]
        if a.isdigit()
    )
    lines = [f"| engine, sum | {header} |", "|---|" + "---|" * header.count("|") + "---|"]
    for label in labels:
        cells = []
        for seed in seeds:
            row = seed["variants"].get(label, {})
            for agent in (a for a in row if a.isdigit()):
                r = row[agent]
                # Older records (before the messages' standard error) give the share alone.
                se = f" ± {r['kept_se_messages']:.2f}" if "kept_se_messages" in r else ""
                cells.append(f"{r['kept']:.2f}{se} (cos {r['cosine']:.2f})")
        lines.append(f"| {label} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--config", default="default", help="config file or shipped name")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 6])
    parser.add_argument("--vllm-dtypes", nargs="+", default=["float32", "bfloat16"])
    parser.add_argument(
        "--repeats", type=int, default=3, help="passes of the stochastic sum (its spread)"
    )
    parser.add_argument(
        "--scale-update", type=float, default=1.0, help="B of each first update times this"
    )
    parser.add_argument("--json", type=Path, help="write the measurements here (after each seed)")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    base = load_config(args.config)
    result: dict[str, Any] = {"config": args.config, "source": base.model.source, "seeds": []}
    if args.json is not None and args.json.is_file():
        before = json.loads(args.json.read_text())
        if before.get("config") == args.config and before.get("source") == base.model.source:
            result["seeds"] = [s for s in before["seeds"] if s["seed"] not in args.seeds]
    for seed in args.seeds:
        result["seeds"].append(one_seed(base, seed, args, lambda line: print(line, flush=True)))
        if args.json is not None:
            args.json.write_text(json.dumps(result, indent=1) + "\n")
    print(markdown(sorted(result["seeds"], key=lambda s: s["seed"])))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
