#!/usr/bin/env bash
# Profile the training step at the paper's model shape on one GPU (an H200): step time, tokens/s, MFU and peak
# device memory for Qwen3-4B with random weights — bf16 compute, fp32 master weights and Adam moments, remat, FSDP
# over all local devices, CISPO over packed micro-batches. Extra arguments go to tools/profile_train_step.py
# (e.g. --row-len 4096 --rows 4 --micro 2 --steps 5).
#
#   bash tools/gpu_train.sh            # the real run (needs jax with CUDA and a GPU)
#   bash tools/gpu_train.sh --tiny     # the same code path on CPU with the tiny preset, in seconds (CI)
#   python tools/profile_train_step.py --plan   # XLA's memory plan of the 4B step, on any backend (no run)
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python}

if [[ "${1:-}" == "--tiny" ]]; then
  shift
  # 4 fake CPU devices, so the FSDP sharding and its collectives really run; low backend optimisation: CI time.
  export JAX_PLATFORMS=cpu
  export XLA_FLAGS="--xla_force_host_platform_device_count=4 --xla_backend_optimization_level=0"
  exec "$PY" tools/profile_train_step.py --tiny "$@"
fi

if command -v nvidia-smi >/dev/null 2>&1; then
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader || true
fi
# Let the step use nearly all of the 141 GB (the default preallocation is 75%); peak_bytes_in_use is still the
# allocator's true high-water mark.
export XLA_PYTHON_CLIENT_MEM_FRACTION=${XLA_PYTHON_CLIENT_MEM_FRACTION:-0.95}
export JAX_COMPILATION_CACHE_DIR=${JAX_COMPILATION_CACHE_DIR:-$HOME/.cache/sera_jax/xla}
exec "$PY" tools/profile_train_step.py "$@"
