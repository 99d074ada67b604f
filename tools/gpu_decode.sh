#!/usr/bin/env bash
# Rollout-engine decode throughput on one GPU (meant for an H200): Qwen3-4B shapes, random bf16 weights, the engine's
# paged attention (sampling.attention.select_impl: the Pallas kernel on GPU; SERA_ATTENTION_IMPL=reference forces the
# pure-JAX reference). Reports tokens/s at batch 1, 64 and 256 (mixed prompt lengths), and at batch 1 the fraction of
# the 4.8 TB/s HBM roofline (a decode step must at least read every weight and the cached K/V once).
# "decode tok/s" subtracts a prefill-only run (max_new_tokens=1) of the same prompts from the full run, so it
# approximates steady decoding; "e2e" is all generated tokens over the whole wall time.
# `--tiny` runs the same script with a tiny model on CPU in seconds (what CI runs: it checks the script, its numbers
# mean nothing). Options: --new-tokens N (default 128), --tiny. Ends with a `RESULT key=value ...` line.
set -euo pipefail
cd "$(dirname "$0")/.."
source tools/gpu_common.sh "$@"
if [[ "$GPU_TINY" == 0 ]]; then
  # The KV pool is sized explicitly below; let XLA keep the rest for the transient gathers of the reference attention.
  export XLA_PYTHON_CLIENT_MEM_FRACTION="${XLA_PYTHON_CLIENT_MEM_FRACTION:-0.92}"
fi
exec "$PY" - "$@" <<'PYEOF'
import argparse, asyncio, time

import jax
import jax.numpy as jnp
import numpy as np

from sera_jax.model import Qwen3Config, init_params
from sera_jax.sampling import Engine, EngineConfig, SamplingParams

ap = argparse.ArgumentParser()
ap.add_argument("--tiny", action="store_true")
ap.add_argument("--new-tokens", type=int, default=None)
args = ap.parse_args()
HBM_BYTES_PER_S = 4.8e12

if args.tiny:
    cfg = Qwen3Config.preset("tiny", dtype="bfloat16", param_dtype="bfloat16")
    new = args.new_tokens or 8
    batches, lens = (1, 4, 8), (8, 40)
    ec = EngineConfig(max_batch=8, block_size=8, num_blocks=128, max_context=64, chunk_steps=8, max_prefill_len=64,
                      max_prefill_batch=8, max_prefill_tokens=512, dtype="bfloat16", prefix_caching=False,
                      batch_buckets=(1, 8), prefill_batch_buckets=(8,), prefill_len_buckets=(64,), width_buckets=(8,),
                      compiler_options=(("xla_backend_optimization_level", 0),
                                        ("xla_llvm_disable_expensive_passes", True)))
else:
    cfg = Qwen3Config.preset("qwen3-4b-instruct-2507", param_dtype="bfloat16")
    new = args.new_tokens or 128
    batches, lens = (1, 64, 256), (256, 2048)
    ec = EngineConfig(max_batch=256, block_size=16, num_blocks=36_864, max_context=2560, chunk_steps=32,
                      max_prefill_len=2048, max_prefill_batch=16, max_prefill_tokens=4096, dtype="bfloat16",
                      prefix_caching=False, batch_buckets=(1, 64, 256), prefill_batch_buckets=(1, 16),
                      prefill_len_buckets=(256, 2048), width_buckets=(144, 160))

print(f"device: {jax.devices()[0].device_kind} x{jax.device_count()}; model {cfg.num_params() / 1e6:.1f}M params, "
      f"bf16 random weights; KV pool {ec.num_blocks} x {ec.block_size} tokens", flush=True)
t0 = time.perf_counter()
params = jax.jit(init_params, static_argnums=1)(jax.random.key(0), cfg)
engine = Engine(cfg, params, ec)
del params
print(f"weights + pool ready in {time.perf_counter() - t0:.1f} s", flush=True)
rs = np.random.RandomState(0)


def run(prompts, max_new):
    sp = SamplingParams(max_new_tokens=max_new, temperature=1.0)

    async def main():
        return await asyncio.gather(*[engine.generate(p, sp, key=jax.random.key(i)) for i, p in enumerate(prompts)])
    t = time.perf_counter()
    res = asyncio.run(main())
    return time.perf_counter() - t, sum(len(r.token_ids) for r in res)


def prompts_for(b):
    if b == 1:
        return [rs.randint(0, cfg.vocab_size, lens[1] // 2).tolist()]
    return [rs.randint(0, cfg.vocab_size, rs.randint(lens[0], lens[1] + 1)).tolist() for _ in range(b)]


t0 = time.perf_counter()
for b in batches:  # warm-up: compile the shapes each scenario uses (prefill-only and full runs)
    ps = prompts_for(b)
    run(ps, 1)
    run(ps, new)
print(f"warm-up (compilation) {time.perf_counter() - t0:.1f} s, {engine.compile_count()} executables", flush=True)

results = {}
c0 = engine.compile_count()
print(f"\n{'batch':>5} {'prompt lens':>13} {'tok/s (e2e)':>12} {'decode tok/s':>13} {'ms/step':>8}")
for b in batches:
    ps = prompts_for(b)
    t_prefill, _ = run(ps, 1)  # prefill (+1 token): subtracted to isolate decode
    t_all, n_tok = run(ps, new)
    decode_s = max(t_all - t_prefill, 1e-9)
    step_s = decode_s / (new - 1)
    results[b] = dict(e2e=n_tok / t_all, decode=b * (new - 1) / decode_s, step_ms=step_s * 1e3,
                      ctx=float(np.mean([len(p) for p in ps])))
    lo, hi = min(len(p) for p in ps), max(len(p) for p in ps)
    print(f"{b:>5} {f'{lo}..{hi}':>13} {results[b]['e2e']:>12.0f} {results[b]['decode']:>13.0f} "
          f"{results[b]['step_ms']:>8.2f}", flush=True)

# Batch-1 roofline: each step reads every weight (bf16) once, plus the K/V of the context (mean over the decode).
kv_bytes_per_token = cfg.num_layers * cfg.num_kv_heads * cfg.head_dim * 2 * 2
weight_bytes = cfg.num_params() * 2
ctx = results[1]["ctx"] + new / 2
min_step_s = (weight_bytes + ctx * kv_bytes_per_token) / HBM_BYTES_PER_S
roofline = 100.0 * min_step_s / (results[1]["step_ms"] / 1e3)
print(f"\nbatch 1: {weight_bytes / 1e9:.2f} GB weights + {ctx * kv_bytes_per_token / 1e9:.3f} GB K/V per step -> "
      f"roofline {min_step_s * 1e3:.3f} ms/step at 4.8 TB/s; measured {results[1]['step_ms']:.3f} ms/step = "
      f"{roofline:.3g}% of roofline")
print(f"compilations during the timed runs: {engine.compile_count() - c0}")
engine.close()
body = " ".join(f"b{b}_tps={r['decode']:.0f} b{b}_e2e_tps={r['e2e']:.0f}" for b, r in results.items())
print(f"RESULT {body} b1_roofline_pct={roofline:.3g} tiny={int(args.tiny)} "
      f"new_compiles={engine.compile_count() - c0}")
PYEOF
