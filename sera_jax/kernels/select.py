"""Which attention implementation runs where: the Pallas kernels on a GPU, the pure-JAX reference elsewhere.

The references live with their owners (``sera_jax.model.qwen3.dense_attention``, ``sera_jax.sampling.attention``),
so the selectors take the reference as an argument instead of importing it: this package stays below the model and
the engine in the import order. Override with the environment variable ``SERA_ATTENTION_IMPL``:

  ``reference``  always the reference;   ``pallas``  the Pallas kernels (interpreted off GPU: slow, for testing);
  ``cudnn``      training attention through ``jax.nn.dot_product_attention(implementation="cudnn")``: cuDNN's fused
                 kernel has no segment-id input in the public API, so the packed mask goes in as a dense boolean
                 [B, 1, T, T] mask, which JAX turns into an additive bias that cuDNN reads from HBM.
"""

from __future__ import annotations

import os
from typing import Callable

import jax
import jax.numpy as jnp

from sera_jax.kernels._common import on_gpu
from sera_jax.kernels.flash_attention import flash_attention
from sera_jax.kernels.paged_attention import paged_attention as paged_attention_kernel

IMPLS = ("reference", "pallas", "cudnn")
ENV = "SERA_ATTENTION_IMPL"


def resolve_impl(impl: str | None = None) -> str:
    """Returns the implementation name to use: ``impl``, else $SERA_ATTENTION_IMPL, else pallas on GPU / reference."""
    impl = impl or os.environ.get(ENV) or ("pallas" if on_gpu() else "reference")
    if impl not in IMPLS:
        raise ValueError(f"unknown attention implementation {impl!r}; expected one of {IMPLS}")
    return impl


def flash_training_attention(q_BTHE, k_BTKE, v_BTKE, layer_cache, aux, **kernel_kwargs):
    """``dense_attention``-compatible: returns (flash_attention(q, k, v, aux["segment_ids"]), layer_cache)."""
    seg = aux["segment_ids"]
    return flash_attention(q_BTHE, k_BTKE, v_BTKE, seg, **kernel_kwargs), layer_cache  # causal by default


def cudnn_training_attention(q_BTHE, k_BTKE, v_BTKE, layer_cache, aux):
    """``dense_attention``-compatible through cuDNN: returns (out, layer_cache); GPU only (cuDNN raises elsewhere)."""
    seg = aux["segment_ids"]
    t = q_BTHE.shape[1]
    mask = (seg[:, :, None] == seg[:, None, :]) & jnp.tril(jnp.ones((t, t), dtype=bool))[None]
    out = jax.nn.dot_product_attention(q_BTHE, k_BTKE, v_BTKE, mask=mask[:, None], scale=q_BTHE.shape[-1] ** -0.5,
                                       implementation="cudnn")
    return out, layer_cache


def select_training_attention(reference: Callable, impl: str | None = None) -> Callable:
    """Returns the training attention_fn (signature of ``dense_attention``) for ``impl`` (see ``resolve_impl``)."""
    impl = resolve_impl(impl)
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
    return reference if impl == "reference" else paged_attention_kernel
