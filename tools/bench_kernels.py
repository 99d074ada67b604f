"""Kernel vs reference: paged decode attention (bandwidth) and packed flash attention (FLOP rate), Qwen3-4B shapes.

Usage: ``python tools/bench_kernels.py [--tiny] [--sweep] [--iters N] [--only decode|flash]`` (or
``tools/gpu_kernels.sh``). ``--sweep`` also times alternative tilings (flash) and page splits (decode, few rows).

Full mode targets one H200: 32 query heads, 8 kv heads, head_dim 128, bf16, block size 16; decode over a ragged
batch of cached contexts, flash over packed rows of causal segments. For each kernel it first checks the result
against the pure-JAX reference at that shape (max error relative to the reference's largest magnitude; exit status
1 on a mismatch), then times both (median of ``iters`` after a warm-up). Rates are useful work only: decode bytes = the cached K/V actually attended (+ q, out), against
4.8 TB/s; flash FLOPs = the unmasked causal-within-segment score and value products (4·E per pair per head forward,
2.5x that backward), against 989 TFLOP/s dense bf16. ``--tiny`` runs tiny shapes on CPU in Pallas interpret mode in
seconds: it checks that the script and the kernels run, its times mean nothing. Ends with a ``RESULT`` line.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np

from sera_jax.kernels import flash_attention
from sera_jax.kernels.flash_attention import Tiles, default_tiles
from sera_jax.kernels.paged_attention import paged_attention as paged_kernel
from sera_jax.model.qwen3 import dense_attention

HBM_TBPS = 4.8
# --tiny is compile-bound (interpret-mode kernels on CPU): XLA's lowest backend optimisation level halves that.
TINY_COMPILE = {"xla_backend_optimization_level": 0}
PEAK_TFLOPS = 989.0


def reference_paged_attention(q, k, v, k_pool, v_pool, layer, table, ctx_len):
    """The engine's reference when present (sera_jax.sampling.attention), else the same gather-based computation."""
    try:
        from sera_jax.sampling.attention import paged_attention
        return paged_attention(q, k, v, k_pool, v_pool, layer, table, ctx_len)
    except ImportError:
        b, t, h, e = q.shape
        kv, s, w = k.shape[2], k_pool.shape[2], table.shape[1]
        kc = jnp.repeat(k_pool[layer, table].reshape(b, w * s, kv, e), h // kv, axis=2)
        vc = jnp.repeat(v_pool[layer, table].reshape(b, w * s, kv, e), h // kv, axis=2)
        keys = jnp.concatenate([kc, jnp.repeat(k, h // kv, axis=2)], axis=1)
        vals = jnp.concatenate([vc, jnp.repeat(v, h // kv, axis=2)], axis=1)
        sc = jnp.einsum("bthe,bshe->bhts", q, keys, preferred_element_type=jnp.float32) * e ** -0.5
        ok = jnp.concatenate([jnp.broadcast_to(jnp.arange(w * s)[None, None] < ctx_len[:, None, None], (b, t, w * s)),
                              jnp.broadcast_to(jnp.tril(jnp.ones((t, t), bool))[None], (b, t, t))], axis=2)
        p = jax.nn.softmax(jnp.where(ok[:, None], sc, -jnp.inf), axis=-1)
        return jnp.einsum("bhts,bshe->bthe", p.astype(q.dtype), vals).astype(q.dtype)


def _jit(tiny: bool):
    return (lambda f: jax.jit(f, compiler_options=TINY_COMPILE)) if tiny else jax.jit


def timed(fn, *args, iters):
    """Returns the median wall time (ms) of ``fn(*args)`` after one warm-up call (which also compiles)."""
    jax.block_until_ready(fn(*args))
    times = []
    for _ in range(iters):
        t0 = time.perf_counter()
        jax.block_until_ready(fn(*args))
        times.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(times)


def max_err(a, b):
    """Returns max |a - b| relative to max |b| (bf16 gradients at 8k tokens are large; absolute error scales)."""
    a, b = jnp.asarray(a, jnp.float32), jnp.asarray(b, jnp.float32)
    return float(jnp.max(jnp.abs(a - b)) / jnp.maximum(jnp.max(jnp.abs(b)), 1e-6))


def bench_decode(tiny: bool, iters: int, interpret: bool, rows: int | None = None, splits: int = 1,
                 prefix: str = "decode"):
    """Returns a dict of decode figures (keys start with ``prefix``): one layer's decode step, ragged paged batch."""
    rng = np.random.default_rng(0)
    if tiny:
        b, h, kv, e, s, lo, hi, dt = 3, 4, 2, 16, 4, 3, 20, jnp.float32
    else:
        b, h, kv, e, s, lo, hi, dt = 128, 32, 8, 128, 16, 512, 8192, jnp.bfloat16
    b = rows or b
    lengths = rng.integers(lo, hi + 1, size=b)
    width = int(-(-lengths.max() // s))
    pages = -(-lengths // s)
    num_blocks = 1 + int(pages.sum())
    table = np.zeros((b, width), np.int32)
    perm = 1 + rng.permutation(num_blocks - 1)
    start = 0
    for r in range(b):
        table[r, :pages[r]] = perm[start:start + pages[r]]
        start += pages[r]
    ks = jax.random.split(jax.random.key(0), 5)
    pool_shape = (1, num_blocks, s, kv, e)
    k_pool, v_pool = jax.random.normal(ks[0], pool_shape, dt), jax.random.normal(ks[1], pool_shape, dt)
    q = jax.random.normal(ks[2], (b, 1, h, e), dt)
    k_new, v_new = jax.random.normal(ks[3], (b, 1, kv, e), dt), jax.random.normal(ks[4], (b, 1, kv, e), dt)
    args = (q, k_new, v_new, k_pool, v_pool, jnp.int32(0), jnp.asarray(table), jnp.asarray(lengths, jnp.int32))
    jit = _jit(tiny)
    kern = jit(lambda *a: paged_kernel(*a, num_splits=splits, interpret=interpret))
    ref = jit(reference_paged_attention)
    err = max_err(kern(*args), ref(*args))  # also the compile: timed() below reuses these jitted functions
    t_k, t_r = timed(kern, *args, iters=iters), timed(ref, *args, iters=iters)
    item = jnp.dtype(dt).itemsize
    moved = (2 * int(lengths.sum()) * kv * e + 2 * b * h * e) * item
    res = {"err": err, "kernel_ms": t_k, "ref_ms": t_r, "speedup": t_r / t_k,
           "TBps": moved / (t_k * 1e-3) / 1e12, "bw_frac": moved / (t_k * 1e-3) / 1e12 / HBM_TBPS,
           "ref_TBps": moved / (t_r * 1e-3) / 1e12}
    return {f"{prefix}_{k}": v for k, v in res.items()}


def _packed_segments(rng, b, t, lo, hi):
    seg = np.zeros((b, t), np.int32)
    pairs = 0
    for r in range(b):
        pos, sid = 0, 1
        while pos < t:
            n = min(int(rng.integers(lo, hi + 1)), t - pos)
            seg[r, pos:pos + n] = sid
            pairs += n * (n + 1) // 2
            pos, sid = pos + n, sid + 1
    return seg, pairs


def _sweep_flash(q, k, v, seg, ct, iters):
    """Returns {name: ms} for alternative forward tiles (forward alone) and backward tiles (forward + backward)."""
    fwd0, bwd0 = default_tiles(q.shape[1])
    res = {}
    for t in (Tiles(64, 64, 4, 2), Tiles(128, 64, 4, 3), Tiles(128, 128, 8, 2), Tiles(128, 32, 4, 3)):
        fn = jax.jit(lambda q, k, v, t=t: flash_attention(q, k, v, seg, fwd_tiles=t, bwd_tiles=bwd0))
        res[f"sweep_fwd_{t.block_q}x{t.block_k}w{t.num_warps}s{t.num_stages}_ms"] = timed(fn, q, k, v, iters=iters)
    for t in (Tiles(32, 64, 4, 2), Tiles(64, 128, 8, 2), Tiles(128, 64, 8, 2), Tiles(32, 128, 4, 2)):
        def run(q, k, v, t=t):
            out, vjp = jax.vjp(lambda q, k, v: flash_attention(q, k, v, seg, fwd_tiles=fwd0, bwd_tiles=t), q, k, v)
            return out, vjp(ct)
        res[f"sweep_fwdbwd_bwd{t.block_q}x{t.block_k}w{t.num_warps}s{t.num_stages}_ms"] = timed(
            jax.jit(run), q, k, v, iters=iters)
    return res


def bench_flash(tiny: bool, iters: int, interpret: bool, sweep: bool = False):
    """Returns a dict of flash figures: forward and forward+backward over packed causal rows."""
    rng = np.random.default_rng(1)
    if tiny:
        b, t, h, kv, e, lo, hi, dt, blocks = 1, 32, 4, 2, 16, 5, 20, jnp.float32, {"block_q": 16, "block_k": 16}
    else:
        # One 8k row: the reference materialises [B, H, T, T] fp32 scores (8.6 GB per row at this size).
        b, t, h, kv, e, lo, hi, dt, blocks = 1, 8192, 32, 8, 128, 256, 4096, jnp.bfloat16, {}
    seg_np, pairs = _packed_segments(rng, b, t, lo, hi)
    seg = jnp.asarray(seg_np)
    ks = jax.random.split(jax.random.key(1), 4)
    q = jax.random.normal(ks[0], (b, t, h, e), dt)
    k = jax.random.normal(ks[1], (b, t, kv, e), dt)
    v = jax.random.normal(ks[2], (b, t, kv, e), dt)
    ct = jax.random.normal(ks[3], (b, t, h, e), dt)
    kern = lambda q, k, v: flash_attention(q, k, v, seg, interpret=interpret, **blocks)
    ref = lambda q, k, v: dense_attention(q, k, v, None, {"segment_ids": seg})[0]

    def fwd_bwd(fn):
        def run(q, k, v):
            out, vjp = jax.vjp(fn, q, k, v)
            return out, vjp(ct)
        return _jit(tiny)(run)

    fns = {"flash_fwdbwd": fwd_bwd(kern), "flash_ref_fwdbwd": fwd_bwd(ref)}
    out_k, g_k = fns["flash_fwdbwd"](q, k, v)
    out_r, g_r = fns["flash_ref_fwdbwd"](q, k, v)
    err = max([max_err(out_k, out_r)] + [max_err(a, c) for a, c in zip(g_k, g_r)])
    del out_k, g_k, out_r, g_r
    flops_fwd = 4.0 * e * h * pairs
    res = {"flash_err": err}
    if not tiny:  # forward-only timings (the tiny run skips them: two more interpret-mode compiles)
        fns.update({"flash_fwd": jax.jit(kern), "flash_ref_fwd": jax.jit(ref)})
    for name, fn in fns.items():
        res[name + "_ms"] = timed(fn, q, k, v, iters=iters)
    if not tiny:  # cuDNN through the public API (dense mask -> bias); report it when this GPU/cuDNN accepts it
        from sera_jax.kernels.select import cudnn_training_attention
        cud = lambda q, k, v: cudnn_training_attention(q, k, v, None, {"segment_ids": seg})[0]
        try:
            res["cudnn_fwdbwd_ms"] = timed(fwd_bwd(cud), q, k, v, iters=iters)
        except Exception as exc:  # noqa: BLE001 - a rejected shape/version is a figure to report, not a crash
            print(f"cudnn: not available here ({type(exc).__name__}: {str(exc)[:200]})")
    if "flash_fwd_ms" in res:
        res["flash_fwd_TFLOPs"] = flops_fwd / (res["flash_fwd_ms"] * 1e-3) / 1e12
        res["flash_fwd_peak_frac"] = res["flash_fwd_TFLOPs"] / PEAK_TFLOPS
    res["flash_fwdbwd_TFLOPs"] = 3.5 * flops_fwd / (res["flash_fwdbwd_ms"] * 1e-3) / 1e12
    res["flash_fwdbwd_peak_frac"] = res["flash_fwdbwd_TFLOPs"] / PEAK_TFLOPS
    res["flash_fwdbwd_speedup"] = res["flash_ref_fwdbwd_ms"] / res["flash_fwdbwd_ms"]
    if sweep and not tiny:
        res.update(_sweep_flash(q, k, v, seg, ct, iters))
    return res


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tiny", action="store_true", help="tiny shapes, CPU interpret mode (a smoke test)")
    ap.add_argument("--iters", type=int, default=None)
    ap.add_argument("--only", choices=("decode", "flash"), default=None)
    ap.add_argument("--sweep", action="store_true", help="also time other flash tilings and decode page splits")
    args = ap.parse_args(argv)
    backend = jax.default_backend()
    interpret = backend != "gpu"
    if not args.tiny and interpret:
        print("no GPU: full-size shapes need one (use --tiny for the CPU interpret-mode smoke run)")
        return 2
    iters = args.iters or (1 if args.tiny else 20)
    print(f"backend={backend} devices={jax.devices()} jax={jax.__version__} interpret={interpret}")
    res = {}
    if args.only in (None, "decode"):
        res.update(bench_decode(args.tiny, iters, interpret))
        if args.sweep and not args.tiny:  # few rows, long contexts: where splitting the page range should pay
            for splits in (1, 4):
                res.update(bench_decode(False, iters, interpret, rows=8, splits=splits, prefix=f"decode8_split{splits}"))
    if args.only in (None, "flash"):
        res.update(bench_flash(args.tiny, iters, interpret, args.sweep))
    for k, v in res.items():
        print(f"  {k:28s} {v:.4g}")
    tol = 1e-4 if args.tiny else 2e-2  # relative; bf16 at full size: the kernel and XLA round differently
    ok = all(v <= tol for k, v in res.items() if k.endswith("_err"))
    fields = " ".join(f"{k}={v:.4g}" for k, v in res.items())
    print(f"RESULT backend={backend}{'-interpret' if interpret else ''} tiny={int(args.tiny)} correct={int(ok)} {fields}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
