"""Which attention implementation runs where: the Pallas kernels on a GPU, the pure-JAX reference elsewhere.

The references live with their owners (``sera_jax.model.qwen3.dense_attention``, ``sera_jax.sampling.attention``),
so the selectors take the reference as an argument instead of importing it: this package stays below the model and
the engine in the import order. Override with the environment variable ``SERA_ATTENTION_IMPL``:

  ``reference``  always the reference;   ``pallas``  the Pallas kernels (interpreted off GPU: slow, for testing);
  ``blockwise``  training attention in pure-JAX query blocks (``blockwise_attention.py``; the default off GPU for
                 training, where it beats XLA's dense attention; paged decode keeps its reference);
  ``cudnn``      training attention through ``jax.nn.dot_product_attention(implementation="cudnn")``: cuDNN's fused
                 kernel has no segment-id input in the public API, so the packed mask goes in as a dense boolean
                 [B, 1, T, T] mask, which JAX turns into an additive bias that cuDNN reads from HBM.
"""

from __future__ import annotations

import functools
import os
from typing import Callable

import jax
import jax.numpy as jnp

from sera_jax.kernels import sharding
from sera_jax.kernels._common import on_gpu
from sera_jax.kernels.blockwise_attention import blockwise_training_attention
from sera_jax.kernels.flash_attention import flash_attention
from sera_jax.kernels.paged_attention import paged_attention as paged_attention_kernel
from sera_jax.kernels.sharding import logical_shard_map

IMPLS = ("reference", "pallas", "cudnn", "blockwise")
ENV = "SERA_ATTENTION_IMPL"


def resolve_impl(impl: str | None = None) -> str:
    """Returns the implementation name to use: ``impl``, else $SERA_ATTENTION_IMPL, else pallas on GPU / reference."""
    impl = impl or os.environ.get(ENV) or ("pallas" if on_gpu() else "reference")
    if impl not in IMPLS:
        raise ValueError(f"unknown attention implementation {impl!r}; expected one of {IMPLS}")
    return impl


def flash_training_attention(q_BTHE, k_BTKE, v_BTKE, layer_cache, aux, **kernel_kwargs):
    """``dense_attention``-compatible: returns (flash_attention(q, k, v, aux["segment_ids"]), layer_cache).

    Under a mesh (``parallel.mesh.activate``) the kernel runs per device on its rows and head groups.
    """
    kernel = functools.partial(flash_attention, **kernel_kwargs)  # causal by default
    run = logical_shard_map(kernel, (sharding.Q, sharding.KV, sharding.KV, sharding.ROWS), sharding.Q)
    return run(q_BTHE, k_BTKE, v_BTKE, aux["segment_ids"]), layer_cache


def sharded_paged_attention(q_BTHE, k_BTKE, v_BTKE, k_pool, v_pool, layer, block_table_BW, ctx_len_B, **kernel_kwargs):
    """The engine-signature Pallas paged attention, run per device under a mesh; returns out [B, T, H, E]."""
    kernel = functools.partial(paged_attention_kernel, **kernel_kwargs)
    specs = (sharding.Q, sharding.KV, sharding.KV, sharding.POOL, sharding.POOL, None, sharding.TABLE,
             sharding.LENGTHS)
    return logical_shard_map(kernel, specs, sharding.Q)(q_BTHE, k_BTKE, v_BTKE, k_pool, v_pool, layer,
                                                         block_table_BW, ctx_len_B)


def cudnn_training_attention(q_BTHE, k_BTKE, v_BTKE, layer_cache, aux):
    """``dense_attention``-compatible through cuDNN: returns (out, layer_cache); GPU only (cuDNN raises elsewhere)."""
    seg = aux["segment_ids"]
    t = q_BTHE.shape[1]
    mask = (seg[:, :, None] == seg[:, None, :]) & jnp.tril(jnp.ones((t, t), dtype=bool))[None]
    out = jax.nn.dot_product_attention(q_BTHE, k_BTKE, v_BTKE, mask=mask[:, None], scale=q_BTHE.shape[-1] ** -0.5,
                                       implementation="cudnn")
    return out, layer_cache


def select_training_attention(reference: Callable, impl: str | None = None) -> Callable:
    """Returns the training attention_fn (signature of ``dense_attention``) for ``impl`` (see ``resolve_impl``;
    unset off GPU: ``blockwise``)."""
    impl = resolve_impl(impl or os.environ.get(ENV) or ("pallas" if on_gpu() else "blockwise"))
    if impl == "blockwise":
        return functools.partial(blockwise_training_attention, reference=reference)
    if impl == "pallas":
        return flash_training_attention
    if impl == "cudnn":
        return cudnn_training_attention
    return reference


def select_paged_attention(reference: Callable, impl: str | None = None) -> Callable:
    """Returns the engine's paged attention (signature of ``sampling.attention.paged_attention``) for ``impl``.

    ``cudnn`` has no paged form, so it means the Pallas kernel here.
    """
    impl = resolve_impl(impl)
    return reference if impl in ("reference", "blockwise") else sharded_paged_attention
