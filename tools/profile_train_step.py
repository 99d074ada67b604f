"""Profile one optimizer step of the real trainer: step time, tokens/s, MFU and peak device memory.

Default: the Qwen3-4B-Instruct-2507 shape with random weights on the local accelerator(s) — bf16 compute, fp32
master weights and Adam moments, remat per layer, FSDP over all local devices, CISPO over packed micro-batches
(``rl.batch.pack_datums`` → ``trainer.stack_micro_batches``), the optax chain of spec §6.3. ``--tiny`` runs the
same path with the tiny preset on CPU in seconds (CI runs it through ``tools/gpu_train.sh --tiny``).

MFU = model FLOPs per step / step time / (devices × peak), peak 989 TFLOP/s (H200 dense bf16), with
model FLOPs = 6·N·tokens + 6·L·H·E·Σ s²: N the parameter count (tied embedding counted once: the lookup is free, the
unembedding matmul is not), tokens the real (non-padding) tokens, and the attention term the causal QKᵀ and PV
products of every packed sequence of length s (2·s²·H·E forward per layer, ×3 for forward + backward). Remat's
recomputation is not counted (that would be HFU), nor the padding and cross-segment scores the dense kernel skips
only by masking.

Prints a table and ``RESULT key=value ...``.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

PEAK_FLOPS = {"gpu": 989e12, "cpu": None}  # per device, dense bf16 (H200 SXM)


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tiny", action="store_true", help="tiny preset on CPU (CI): same code path, seconds")
    ap.add_argument("--preset", default=None, help="model preset (default qwen3-4b-instruct-2507, tiny with --tiny)")
    ap.add_argument("--row-len", type=int, default=None, help="tokens per packed row (default 4096; tiny 128)")
    ap.add_argument("--rows", type=int, default=None, help="rows per micro-batch (default 2; tiny 4)")
    ap.add_argument("--micro", type=int, default=None, help="micro-batches per optimizer step (default 2)")
    ap.add_argument("--steps", type=int, default=None, help="timed steps after the warm-up (default 5; tiny 2)")
    ap.add_argument("--seq-min", type=int, default=None, help="shortest packed sequence (default row-len/8)")
    ap.add_argument("--dtype", default=None, help="compute dtype (default: the preset's; bfloat16 for 4B)")
    ap.add_argument("--no-remat", action="store_true", help="keep every layer's activations")
    ap.add_argument("--plan", action="store_true",
                    help="compile the step for abstract inputs on any backend and print XLA's memory plan; no run")
    ap.add_argument("--peak-tflops", type=float, default=None, help="per-device peak for MFU (default 989 on GPU)")
    args = ap.parse_args(argv)
    if args.tiny:
        defaults = dict(preset="tiny", row_len=128, rows=4, micro=2, steps=2)
    else:
        # 16,384 positions per step: XLA's dense attention keeps [rows, heads, T, T] fp32 scores per layer, and the
        # compiled plan (--plan) of this shape needs ~105 GiB of the H200's 141 (8192-token rows: ~124 GiB).
        defaults = dict(preset="qwen3-4b-instruct-2507", row_len=4096, rows=2, micro=2, steps=5)
    for k, v in defaults.items():
        if getattr(args, k) is None:
            setattr(args, k, v)
    if args.seq_min is None:
        args.seq_min = max(8, args.row_len // 8)
    return args


def synthetic_datums(cfg, rows: int, row_len: int, seq_min: int, seed: int = 0):
    """Returns datums that pack into ``rows`` rows filled to 15/16: each row is cut into sequences of ≥ ``seq_min``
    positions (a datum of L tokens fills L − 1), the second half of each sequence trained, advantages
    ±1, behaviour logprobs ≈ an untrained model's (−log V + noise)."""
    import numpy as np

    from sera_jax.rl.datums import Datum

    rng = np.random.default_rng(seed)
    out = []
    for _ in range(rows):
        left = row_len - row_len // 16  # slack: first-fit decreasing re-packs the pieces into the same row count
        while left > 0:
            n = left if left < 2 * seq_min else int(rng.integers(seq_min, min(left - seq_min, row_len // 2) + 1))
            left -= n
            toks = rng.integers(0, cfg.vocab_size, n + 1)
            logp = -np.log(cfg.vocab_size) + rng.normal(0, 0.5, n + 1)
            prompt = (n + 1) // 2
            out.append(Datum(tokens=tuple(int(t) for t in toks), mask=(0,) * prompt + (1,) * (n + 1 - prompt),
                             logprobs=tuple(float(x) for x in logp), versions=(0,) * (n + 1),
                             scalar=float(rng.choice([-1.0, 1.0])), objective="execution", traj_depth=0,
                             traj_start=1))
    return out


def model_flops(cfg, seq_lengths) -> float:
    """Returns 6·N·tokens + 6·L·H·E·Σ s² (see the module docstring)."""
    tokens = sum(seq_lengths)
    attn = 6.0 * cfg.num_layers * cfg.num_heads * cfg.head_dim * sum(float(s) * s for s in seq_lengths)
    return 6.0 * cfg.num_params() * tokens + attn


def plan(cfg, tx, micro: int, rows: int, row_len: int) -> dict:
    """Returns XLA's compiled memory plan (GiB) of one train step on one device of the current backend, for
    abstract state and batch: nothing is allocated, so a 4B step can be planned on a laptop."""
    import functools

    import jax
    import jax.numpy as jnp

    from sera_jax.model import abstract_params
    from sera_jax.rl.batch import MicroBatch
    from sera_jax.trainer import init_train_state, train_step

    state = jax.eval_shape(lambda p: init_train_state(p, tx), abstract_params(cfg))
    shape = (micro, rows, row_len)
    arr = {name: jax.ShapeDtypeStruct(shape, jnp.int32) for name in ("tokens", "targets", "positions", "segment_ids")}
    arr.update({name: jax.ShapeDtypeStruct(shape, jnp.float32) for name in ("loss_mask", "advantages", "old_logprobs")})
    batch = MicroBatch(**arr, num_tokens=jax.ShapeDtypeStruct((micro,), jnp.int32))
    fn = jax.jit(functools.partial(train_step, model_cfg=cfg, tx=tx), donate_argnums=0)
    t0 = time.perf_counter()
    stats = fn.lower(state, batch).compile().memory_analysis()
    gib = {k: getattr(stats, f"{k}_size_in_bytes") / 2**30 for k in ("argument", "output", "alias", "temp")}
    gib["total"] = gib["argument"] + gib["output"] - gib["alias"] + gib["temp"]
    gib["compile_s"] = time.perf_counter() - t0
    return gib


def main(argv=None) -> dict:
    args = parse_args(argv)
    import jax
    import numpy as np

    from sera_jax.model import Qwen3Config, init_params
    from sera_jax.parallel import MeshConfig, make_mesh, param_shardings
    from sera_jax.rl.batch import pack_datums
    from sera_jax.rl.optim import OptimConfig, make_optimizer
    from sera_jax.trainer import batch_axis_size, make_train_step, shard_train_state, stack_micro_batches

    backend = jax.default_backend()
    if args.plan:
        over = {"remat": False} if args.no_remat else {}
        cfg = Qwen3Config.preset(args.preset, param_dtype="float32", **({"dtype": args.dtype} if args.dtype else {}),
                                 **over)
        gib = plan(cfg, make_optimizer(OptimConfig(warmup_steps=0)), args.micro, args.rows, args.row_len)
        print(f"memory plan of one step on {backend}: {args.preset}, compute {cfg.dtype}, remat {cfg.remat}, "
              f"{args.micro} x {args.rows} x {args.row_len} positions (single device, state donated)")
        for k in ("argument", "output", "alias", "temp", "total"):
            print(f"{k + ' (GiB)':32s}{gib[k]:>12.2f}")
        result = {"mode": "plan", "backend": backend, "positions": args.micro * args.rows * args.row_len,
                  "args_gib": round(gib["argument"], 2), "temp_gib": round(gib["temp"], 2),
                  "total_gib": round(gib["total"], 2), "compile_s": round(gib["compile_s"], 1)}
        print("RESULT " + " ".join(f"{k}={v}" for k, v in result.items()))
        return result
    if not args.tiny and backend != "gpu":
        raise SystemExit(f"no GPU visible to JAX (backend {backend!r}): install jax[cuda12], or run --tiny on CPU")
    over = {"remat": False} if args.no_remat else {}
    if args.dtype:
        over["dtype"] = args.dtype
    cfg = Qwen3Config.preset(args.preset, param_dtype="float32", **over)
    cfg = cfg.replace(logits_chunk=min(cfg.logits_chunk, args.row_len))
    devices = jax.local_devices()
    mesh = make_mesh(MeshConfig(data=1, fsdp=len(devices), tensor=1), devices=devices)
    tx = make_optimizer(OptimConfig(warmup_steps=0))  # the paper's lr 3e-6 etc.; no warm-up so every step updates

    t0 = time.perf_counter()
    # Random weights created on device directly in their FSDP layout (a 4B fp32 copy never touches the host).
    # The embedding (tied: also the unembedding) scaled to std 0.02 as in Hugging Face's initialiser, so the random
    # model's token logprobs sit near −log V like the synthetic behaviour logprobs, and CISPO ratios near 1.
    def hf_like_init(key):
        p = init_params(key, cfg)
        return {**p, "embed": {**p["embed"], "embedding": p["embed"]["embedding"] * 0.02}}

    init = jax.jit(hf_like_init, out_shardings=param_shardings(cfg, mesh))
    params = init(jax.random.key(0))
    state = shard_train_state(params, tx, cfg, mesh)
    del params
    jax.block_until_ready(state)
    init_s = time.perf_counter() - t0

    datums = synthetic_datums(cfg, args.rows * args.micro, args.row_len, args.seq_min)
    packed = pack_datums(datums, token_budget=args.rows * args.row_len, row_len=args.row_len)
    # First-fit packing may need a row more than the exact cut it is given: never drop a micro-batch.
    num_micro = max(args.micro, len(packed.micro_batches))
    host_batch = stack_micro_batches(packed.micro_batches, num=num_micro, row_multiple=batch_axis_size(mesh))
    seq_lengths = [len(d.tokens) - 1 for d in datums]
    tokens = int(np.sum(np.asarray(host_batch.segment_ids) > 0))
    assert tokens == sum(seq_lengths)
    step = make_train_step(cfg, tx, mesh=mesh, state=state)
    batch = jax.device_put(host_batch, step.batch_sharding)

    t0 = time.perf_counter()
    state, metrics = step(state, batch)
    jax.block_until_ready(metrics)
    first_s = time.perf_counter() - t0
    times = []
    for _ in range(args.steps):
        t0 = time.perf_counter()
        state, metrics = step(state, batch)
        jax.block_until_ready(metrics)
        times.append(time.perf_counter() - t0)
    step_s = float(np.median(times))

    flops = model_flops(cfg, seq_lengths)
    peak = args.peak_tflops * 1e12 if args.peak_tflops else PEAK_FLOPS.get(backend)
    mfu = flops / step_s / (peak * len(devices)) if peak else None
    stats = [d.memory_stats() or {} for d in devices]
    peak_mem = max((s.get("peak_bytes_in_use", 0) for s in stats), default=0) or None
    state_bytes = sum(x.nbytes for x in jax.tree.leaves(state))

    print(f"model: {args.preset} ({cfg.num_params() / 1e9:.3f} B params), compute {cfg.dtype}, master "
          f"{cfg.param_dtype}, remat {cfg.remat}; mesh fsdp={len(devices)} on {backend} "
          f"({devices[0].device_kind})")
    print(f"step: {num_micro} micro-batches x {args.rows} rows x {args.row_len} tokens = {tokens} tokens "
          f"({len(datums)} packed sequences, {int(packed.num_tokens)} loss tokens); CISPO, AdamW lr 3e-6, clip 1.0")
    print()
    rows = [("init + shard state (s)", f"{init_s:.2f}"), ("first step incl. compile (s)", f"{first_s:.2f}"),
            ("step time, median (s)", f"{step_s:.4f}"), ("step time, min / max (s)", f"{min(times):.4f} / "
                                                                                   f"{max(times):.4f}"),
            ("tokens/s", f"{tokens / step_s:,.0f}"), ("tokens/s per device", f"{tokens / step_s / len(devices):,.0f}"),
            ("model TFLOP per step", f"{flops / 1e12:.4g}"),
            ("MFU", f"{100 * mfu:.1f}%" if mfu is not None else "n/a (no peak for this backend)"),
            ("peak device memory (GiB)", f"{peak_mem / 2**30:.2f}" if peak_mem else "n/a (backend reports none)"),
            ("train state (GiB, all devices)", f"{state_bytes / 2**30:.2f}"),
            ("loss / grad norm (last step)", f"{float(metrics['loss']):.4f} / {float(metrics['grad_norm']):.4f}"),
            ("skipped (non-finite)", f"{int(float(metrics['skipped']))}")]
    for name, value in rows:
        print(f"{name:32s}{value:>20s}")
    result = {"mode": "tiny" if args.tiny else "full", "backend": backend, "devices": len(devices),
              "params_b": round(cfg.num_params() / 1e9, 4), "tokens": tokens, "step_s": round(step_s, 4),
              "tok_s": round(tokens / step_s), "mfu": round(mfu, 4) if mfu is not None else "na",
              "peak_mem_gib": round(peak_mem / 2**30, 2) if peak_mem else "na",
              "compile_s": round(first_s, 2), "skipped": int(float(metrics["skipped"]))}
    print("RESULT " + " ".join(f"{k}={v}" for k, v in result.items()))
    if not np.isfinite(float(metrics["loss"])) or int(float(metrics["skipped"])):
        raise SystemExit("the profiled step produced a non-finite loss or was skipped")
    return result


if __name__ == "__main__":
    main()
