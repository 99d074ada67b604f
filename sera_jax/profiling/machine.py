"""This machine's measured matmul rate: benchmarks print it beside their timings (a shared machine's speed varies
from run to run, and a time scales about inversely with it)."""

from __future__ import annotations

import time
from typing import Any

import jax
import jax.numpy as jnp


def matmul_rate(cfg: Any) -> float:
    """Returns this machine's fp32 FLOP/s on the model's largest projection ([1024, D] x [D, F]) under XLA."""
    x = jnp.ones((1024, cfg.hidden_size), jnp.float32)
    w = jnp.ones((cfg.hidden_size, cfg.intermediate_size), jnp.float32)
    f = jax.jit(lambda x, w: x @ w)
    f(x, w).block_until_ready()
    t0 = time.perf_counter()
    for _ in range(200):
        f(x, w).block_until_ready()
    return 200 * 2 * x.shape[0] * w.shape[0] * w.shape[1] / (time.perf_counter() - t0)
