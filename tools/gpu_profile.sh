#!/usr/bin/env bash
# Profile on one GPU (meant for an H200) at the paper's model shape, Qwen3-4B with random weights:
#   1. N sharded train steps (bf16 compute, fp32 master weights and Adam moments, remat, FSDP over the local devices,
#      CISPO over 2 micro-batches x 2 rows x 4096 tokens), and
#   2. N decode chunks of the rollout engine (bf16, 64 rows, 1024-token prompts, 32 steps per chunk, paged KV),
# each in its own process (so each peak-memory figure is its own), under jax.profiler. Prints both reports (compile
# time, step time, tokens/s, MFU with its formula, peak device memory) and their RESULT lines, then one combined
# `RESULT key=value ...` line. Traces: OUT/train/trace and OUT/decode/trace (tensorboard --logdir OUT, or
# perfetto_trace.json.gz in ui.perfetto.dev).
#
#   bash tools/gpu_profile.sh [--out DIR] [--steps N]   # the real run (needs jax with CUDA and a GPU)
#   bash tools/gpu_profile.sh --tiny [--out DIR]        # the same code paths on CPU with the tiny preset (CI)
set -euo pipefail
cd "$(dirname "$0")/.."
source tools/gpu_common.sh "$@"
TINY=()
OUT="sera_profile/$(date -u +%Y%m%d-%H%M%S)"
ARGS=()
while [[ $# -gt 0 ]]; do
  case "$1" in
    --tiny) TINY=(--tiny); shift ;;
    --out) OUT="$2"; shift 2 ;;
    *) ARGS+=("$1"); shift ;;
  esac
done

if [[ ${#TINY[@]} -gt 0 ]]; then
  # 4 fake CPU devices, so the FSDP sharding and its collectives really run; low backend optimisation: CI time.
  export XLA_FLAGS="--xla_force_host_platform_device_count=4 --xla_backend_optimization_level=0"
else
  # Let the step use nearly all of the 141 GB (the default preallocation is 75%); peak_bytes_in_use is still the
  # allocator's true high-water mark.
  export XLA_PYTHON_CLIENT_MEM_FRACTION="${XLA_PYTHON_CLIENT_MEM_FRACTION:-0.95}"
  # No persistent compilation cache here: the reported compile time is a real compilation.
fi

LOG="$(mktemp)"
trap 'rm -f "$LOG"' EXIT
echo "== train step =="
"$PY" -m sera_jax.cli.profile "${TINY[@]}" --out "$OUT/train" "${ARGS[@]}" | tee "$LOG"
TRAIN="$(grep '^RESULT ' "$LOG" | tail -1)"
echo
echo "== decode chunks =="
"$PY" -m sera_jax.cli.profile "${TINY[@]}" --decode --out "$OUT/decode" "${ARGS[@]}" | tee "$LOG"
DECODE="$(grep '^RESULT ' "$LOG" | tail -1)"

field() { tr ' ' '\n' <<<"$1" | sed -n "s/^$2=//p"; }
echo
echo "RESULT mode=$(field "$TRAIN" mode) backend=$(field "$TRAIN" backend) out=$OUT" \
  "train_step_s=$(field "$TRAIN" step_s) train_tok_s=$(field "$TRAIN" tok_s) train_mfu=$(field "$TRAIN" mfu)" \
  "train_compile_s=$(field "$TRAIN" compile_s) train_peak_mem_gib=$(field "$TRAIN" peak_mem_gib)" \
  "train_trace_files=$(field "$TRAIN" trace_files) decode_chunk_s=$(field "$DECODE" chunk_s)" \
  "decode_tok_s=$(field "$DECODE" tok_s) decode_mfu=$(field "$DECODE" mfu)" \
  "decode_roofline=$(field "$DECODE" roofline)" \
  "decode_compile_s=$(field "$DECODE" compile_s) decode_peak_mem_gib=$(field "$DECODE" peak_mem_gib)" \
  "decode_trace_files=$(field "$DECODE" trace_files)"
