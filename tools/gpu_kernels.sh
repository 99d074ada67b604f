#!/usr/bin/env bash
# Kernel vs reference on a GPU (meant for one H200): paged decode bandwidth, packed flash-attention FLOP rate, at
# Qwen3-4B shapes; checks each kernel's result at that shape first. `--tiny` runs on CPU in Pallas interpret mode in
# seconds (what CI runs). Other arguments go to tools/bench_kernels.py (--iters N, --only decode|flash).
# Ends with a `RESULT key=value ...` line; exit status 1 if a kernel disagrees with its reference.
set -euo pipefail
cd "$(dirname "$0")/.."
source tools/gpu_common.sh "$@"
if [[ "$GPU_TINY" == 0 ]]; then
  # Timing wants the whole GPU and no preallocation surprises between the kernel and the (memory-hungry) reference.
  export XLA_PYTHON_CLIENT_PREALLOCATE="${XLA_PYTHON_CLIENT_PREALLOCATE:-false}"
fi
exec "$PY" tools/bench_kernels.py "$@"
