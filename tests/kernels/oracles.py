"""Plain NumPy/JAX oracles and random-case builders for the kernel tests (written for clarity, not speed)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

# Interpret-mode kernels are compile-bound on CPU; XLA's lowest backend optimisation level compiles them in about
# 60% of the time (results differ from the default level by fp32 rounding only). Tests jit through this.
FAST_COMPILE = {"xla_backend_optimization_level": 0}


def fast_jit(fn, **kwargs):
    """Returns ``jax.jit(fn)`` compiled with ``FAST_COMPILE``."""
    return jax.jit(fn, compiler_options=FAST_COMPILE, **kwargs)


def make_paged_case(rng, *, batch, kv_heads, group, head_dim, block_size, lengths, shared_prefix_blocks=0,
                    layers=2, t_new=1, dtype=jnp.float32):
    """Returns a dict with q, k_new, v_new, k_pool, v_pool, layer, table, lengths (a random paged cache).

    Rows get distinct random blocks, except that the first ``shared_prefix_blocks`` of every row are the same
    blocks (a shared prefix). Pool blocks no row owns, table entries past a row's last page and slots past a row's
    length in its last page are NaN or out of range: a kernel that reads them fails the comparison.
    """
    heads = kv_heads * group
    width = max(1, max(-(-n // block_size) for n in lengths))
    num_blocks = 1 + batch * width + 2
    k_pool = np.full((layers, num_blocks, block_size, kv_heads, head_dim), np.nan, np.float32)
    v_pool = np.full_like(k_pool, np.nan)
    free = list(rng.permutation(np.arange(1, num_blocks)))
    shared = [free.pop() for _ in range(shared_prefix_blocks)]
    table = np.full((batch, width), 10 ** 6, np.int32)  # garbage past each row's pages
    for b, n in enumerate(lengths):
        pages = -(-n // block_size)
        blocks = shared[:pages] + [free.pop() for _ in range(max(0, pages - len(shared)))]
        table[b, :pages] = blocks
        for p, blk in enumerate(blocks):
            filled = min(block_size, n - p * block_size)
            k_pool[:, blk, :filled] = rng.normal(size=(layers, filled, kv_heads, head_dim))
            v_pool[:, blk, :filled] = rng.normal(size=(layers, filled, kv_heads, head_dim))
    as_j = lambda x: jnp.asarray(x, dtype)
    return {"q": as_j(rng.normal(size=(batch, t_new, heads, head_dim))),
            "k_new": as_j(rng.normal(size=(batch, t_new, kv_heads, head_dim))),
            "v_new": as_j(rng.normal(size=(batch, t_new, kv_heads, head_dim))),
            "k_pool": as_j(k_pool), "v_pool": as_j(v_pool), "layer": 1, "table": jnp.asarray(table),
            "lengths": jnp.asarray(np.asarray(lengths, np.int32))}


def paged_oracle(case, *, include_new: bool):
    """Returns (out [B, T, H, E], lse [B, T, H]) in float64 NumPy: queries over cached (+ causal new) tokens."""
    q = np.asarray(case["q"], np.float64)
    b, t, h, e = q.shape
    kp, vp = (np.asarray(case[n], np.float64)[case["layer"]] for n in ("k_pool", "v_pool"))
    table, lengths = np.asarray(case["table"]), np.asarray(case["lengths"])
    s_blk = kp.shape[1]
    g = h // kp.shape[2]
    out, lse = np.zeros((b, t, h, e)), np.full((b, t, h), -np.inf)
    for r in range(b):
        n = int(lengths[r])
        pos = np.arange(n)
        keys = kp[table[r, pos // s_blk], pos % s_blk]  # [n, K, E]
        vals = vp[table[r, pos // s_blk], pos % s_blk]
        for ti in range(t):
            kk, vv = keys, vals
            if include_new:
                kk = np.concatenate([kk, np.asarray(case["k_new"], np.float64)[r, :ti + 1]])
                vv = np.concatenate([vv, np.asarray(case["v_new"], np.float64)[r, :ti + 1]])
            if len(kk) == 0:
                continue
            for hh in range(h):
                sc = kk[:, hh // g] @ q[r, ti, hh] * e ** -0.5
                top = sc.max()
                w = np.exp(sc - top)
                lse[r, ti, hh] = top + np.log(w.sum())
                out[r, ti, hh] = (w / w.sum()) @ vv[:, hh // g]
    return out, lse


def packed_segments(rng, batch, length, max_segments=3, pad=True):
    """Returns int32 segment ids [B, T]: contiguous runs 1..k of random lengths, then a run of 0s (padding)."""
    seg = np.zeros((batch, length), np.int32)
    for b in range(batch):
        cuts = np.sort(rng.choice(np.arange(1, length), size=max_segments, replace=False))
        end = cuts[-1] if pad else length
        bounds = [0, *cuts[:-1], end]
        for i in range(len(bounds) - 1):
            seg[b, bounds[i]:bounds[i + 1]] = i + 1
    return jnp.asarray(seg)
