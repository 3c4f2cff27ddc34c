#!/usr/bin/env bash
# GPU check, one command on a GPU machine (stock PyTorch: torch, transformers, accelerate, peft):
#   bash benchmarks/gpu_check.sh [gpu_check.py options]
# Role-wise GRPO steps with the Transformers engine on CUDA (bfloat16 and float32) beside the same steps
# on CPU, in one run: generated tokens/s, step time, peak GPU memory and the trainer/engine logprob mismatch
# (benchmarks/perf/gpu_check.py). Under 10 minutes on one GPU with the defaults.
# Where a CUDA build of vLLM is importable (installed beforehand, `pip install vllm`: the check fetches nothing),
# the vLLM engine is checked too: greedy ids and logprobs against the HF engine, the weight
# sync after an AdamW step, sleep/wake, then the GRPO steps with --engine vllm; a failed vLLM check exits 1.
# benchmarks/gpu_assets/ (SmolLM2-135M's config and tokenizer, no weights; the wheels of gymnasium and its
# two small dependencies) is written by `python -m benchmarks.perf.gpu_check --prepare` on a machine with the
# project's venv, and travels with the working tree (a few MB).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
if [ ! -f benchmarks/gpu_assets/smollm2-135m/config.json ]; then
  "$PY" -m benchmarks.perf.gpu_check --prepare
fi
if ! "$PY" -c "import gymnasium" 2>/dev/null; then
  "$PY" -m pip install -q --no-index --no-deps benchmarks/gpu_assets/wheels/*.whl
fi
export HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
exec "$PY" -m benchmarks.perf.gpu_check "$@"
