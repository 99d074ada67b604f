"""Small pieces shared by the kernels: masked-score constant, tile-size rounding, merging partial softmaxes.

A partial attention result is a pair (out, lse): ``out`` is the softmax-weighted value average over some subset of
the keys and ``lse`` the log of that subset's softmax denominator (-inf for an empty subset). Two partials over
disjoint key sets combine exactly, which lets a kernel work over the paged cache while the few new tokens of a
step are handled separately, and lets a long context be split across programs.
"""

from __future__ import annotations

import contextlib
import contextvars
from typing import Iterator

import jax
import jax.numpy as jnp

# Scores of masked keys. Finite, so that a row whose first tiles are fully masked never computes (-inf) - (-inf);
# those tiles also zero their probabilities explicitly, so the value never leaks into a sum.
MASKED = -1e30


def round_up(x: int, multiple: int) -> int:
    """Returns the smallest multiple of ``multiple`` that is ≥ x."""
    return -(-x // multiple) * multiple


def pow2_at_least(x: int, floor: int = 16) -> int:
    """Returns the smallest power of two ≥ max(x, floor) (Triton tiles must be powers of two, dots ≥ 16)."""
    p = floor
    while p < x:
        p *= 2
    return p


def merge_partials(outs, lses):
    """Returns (out, lse) of the union of disjoint key sets from partials ``outs[i]`` [..., E], ``lses[i]`` [...].

    Partials over empty key sets (lse = -inf, out anything finite) contribute nothing. Computed in fp32.
    """
    lse_all = jnp.stack([x.astype(jnp.float32) for x in lses])  # [P, ...]
    top = jnp.max(lse_all, axis=0)
    top_safe = jnp.where(jnp.isfinite(top), top, 0.0)
    w = jnp.exp(lse_all - top_safe)  # exp(-inf) = 0 for empty partials
    denom = jnp.sum(w, axis=0)
    out = sum(w[i][..., None] * outs[i].astype(jnp.float32) for i in range(len(outs)))
    out = out / jnp.where(denom > 0, denom, 1.0)[..., None]
    lse = jnp.where(denom > 0, top_safe + jnp.log(jnp.where(denom > 0, denom, 1.0)), -jnp.inf)
    return out, lse


# The backend being compiled for, when it is not the one running: a deviceless compile for a described GPU
# (``profiling.aot``) traces on a CPU host, yet must select and compile the Pallas kernels, not the references.
_TARGET_BACKEND: contextvars.ContextVar[str | None] = contextvars.ContextVar("sera_target_backend", default=None)


@contextlib.contextmanager
def target_backend(backend: str) -> Iterator[None]:
    """Within the block, code traced here selects its kernels for ``backend`` ("gpu", "cpu") instead of JAX's
    default backend (``on_gpu`` reads it at trace time)."""
    token = _TARGET_BACKEND.set(backend)
    try:
        yield
    finally:
        _TARGET_BACKEND.reset(token)


def on_gpu() -> bool:
    """Returns True when the code being traced targets a GPU: ``target_backend("gpu")`` is in force, or JAX's
    default backend is a GPU (CUDA or ROCm)."""
    return (_TARGET_BACKEND.get() or jax.default_backend()) == "gpu"


def compiler_params(interpret: bool, num_warps: int, num_stages: int):
    """Returns Triton compiler params for a compiled GPU kernel, None in interpret mode."""
    if interpret:
        return None
    from jax.experimental.pallas import triton as plgpu  # imported lazily: only the GPU path needs it
    return plgpu.CompilerParams(num_warps=num_warps, num_stages=num_stages)
