"""Per-token log-probabilities without materialising [tokens × vocab] logits for the whole sequence.

A 60k-token micro-batch against Qwen3's 151,936-entry vocabulary would be 36 GB of fp32 logits. Instead the
head runs in steps of about ``chunk`` tokens per device (the same positions of every row); each step's logits
exist only inside a rematerialised (``jax.checkpoint``) body of a ``lax.map``, so forward and backward both hold one
step's logits at a time. Under a mesh the head runs per device on its rows (see ``chunked_logprobs``).
"""

from __future__ import annotations

import math

import flax.linen as nn
import jax
import jax.numpy as jnp
from jax.sharding import PartitionSpec
from jaxtyping import Array, Float, Int

from sera_jax.model.config import Qwen3Config
from sera_jax.model.qwen3 import Params, hidden_states
from sera_jax.parallel.rules import mesh_spec


def chunked_logprobs(hidden_BTD: Float[Array, "B T D"], unembed_DV: Float[Array, "D V"],
                     targets_BT: Int[Array, "B T"], chunk: int,
                     mask_BT: Int[Array, "B T"] | None = None) -> Float[Array, "B T"]:
    """Returns log softmax(hidden @ unembed)[target] per token (fp32), about ``chunk`` tokens per device at a time.

    Each step of the loop takes the same ``c`` positions of every row: logits [B, c, V] (``c`` = ``chunk`` / rows
    per device, so ``chunk`` bounds one device's logits). The loop runs along the length axis, never along the rows.

    With ``mask_BT`` only the masked positions are wanted (the loss tokens of a training batch; prompts and padding
    are not): each row's masked positions are moved to its front (a stable per-row sort), a step where no row has
    any is skipped (``lax.cond``, forward and backward), and unmasked positions return 0 (their hidden states never
    enter the matmul). In agent rollouts most tokens are prompt, so most of the [tokens × vocab] head matmul is
    skipped; the wanted values are the same function.

    Under a mesh with logical rules (``parallel.mesh.activate``) whose ``batch`` axes divide the rows, the head runs
    per device (``shard_map``) on its own rows: the unembedding comes in as the parameter is laid out (``embed``
    split, e.g. FSDP) and is all-gathered once inside. Why: the transpose of that all-gather is a reduce-scatter, so
    the unembedding's gradient is accumulated over the loop's steps locally and reduce-scattered once, and its shard
    summed over the axes that replicate it (data, across hosts): FSDP's minimum. Under XLA's automatic partitioning
    the gathered matrix's gradient was all-reduced whole, in fp32, at every step of the loop. No logits leave a
    device either way.
    """
    if mask_BT is not None and mask_BT.shape != targets_BT.shape:
        raise ValueError(f"mask shape {mask_BT.shape} != targets shape {targets_BT.shape}")
    mesh = jax.sharding.get_abstract_mesh()
    rules = nn.get_logical_axis_rules()
    if mesh.empty or mesh.size == 1 or not rules:
        return _local_logprobs(hidden_BTD, unembed_DV, targets_BT, chunk, mask_BT)
    batch_axes, embed_axes, vocab_axes = (mesh_spec((name,), rules)[0] for name in ("batch", "embed", "vocab"))
    rows_split, embed_split = _axes_size(mesh, batch_axes), _axes_size(mesh, embed_axes)
    if hidden_BTD.shape[0] % rows_split or unembed_DV.shape[0] % embed_split:
        # Rows the mesh does not divide (a direct call on a small batch): XLA's partitioning, logits still chunked.
        unembed_DV = nn.with_logical_constraint(unembed_DV, ("act_embed", "vocab"))
        return _local_logprobs(nn.with_logical_constraint(hidden_BTD, ("batch", "length", "act_embed")),
                               unembed_DV, targets_BT, chunk // max(1, rows_split), mask_BT,
                               rows_per_device=-(-hidden_BTD.shape[0] // rows_split))
    del vocab_axes  # the vocabulary enters whole (in_specs below): a tensor-split vocab is gathered on entry

    def per_device(h_BTD, u_shard_DV, y_BT, *m_BT):
        u_DV = u_shard_DV if embed_axes is None else jax.lax.all_gather(u_shard_DV, embed_axes, axis=0, tiled=True)
        return _local_logprobs(h_BTD, u_DV, y_BT, chunk, m_BT[0] if m_BT else None)

    rows = PartitionSpec(batch_axes, None)
    args = (hidden_BTD, unembed_DV, targets_BT) + (() if mask_BT is None else (mask_BT,))
    specs = (PartitionSpec(batch_axes, None, None), PartitionSpec(embed_axes, None), rows) + (
        () if mask_BT is None else (rows,))
    return jax.shard_map(per_device, mesh=mesh, in_specs=specs, out_specs=rows, check_vma=False)(*args)


def _axes_size(mesh, axes) -> int:
    if axes is None:
        return 1
    return math.prod(mesh.shape[a] for a in ((axes,) if isinstance(axes, str) else axes))


def _local_logprobs(hidden_BTD, unembed_DV, targets_BT, chunk: int, mask_BT=None, *, rows_per_device: int | None = None):
    """``chunked_logprobs`` on arrays of one device (or XLA-partitioned ones, ``rows_per_device`` given)."""
    b, t, d = hidden_BTD.shape
    h_BTD, y_BT = hidden_BTD, targets_BT
    if mask_BT is not None:
        keep_BT = mask_BT > 0
        order_BT = jnp.argsort(~keep_BT, axis=1, stable=True)  # each row's wanted positions first, in order
        h_BTD = jnp.take_along_axis(hidden_BTD, order_BT[..., None], axis=1)
        y_BT = jnp.take_along_axis(targets_BT, order_BT, axis=1)
        live_BT = jnp.take_along_axis(keep_BT, order_BT, axis=1)
    c = max(1, min(t, chunk // (rows_per_device or b)))  # positions of each row per step
    k = -(-t // c)
    pad = k * c - t

    def steps(x_BT_):  # [B, T, ...] -> [k, B, c, ...]: the loop axis first, rows kept whole in each step
        x = jnp.pad(x_BT_, ((0, 0), (0, pad)) + ((0, 0),) * (x_BT_.ndim - 2))
        return jnp.swapaxes(x.reshape(b, k, c, *x_BT_.shape[2:]), 0, 1)

    h_KBCD, y_KBC = steps(h_BTD), steps(y_BT)

    def logprobs(h_BCD, y_BC):
        logits_BCV = jnp.einsum("bcd,dv->bcv", h_BCD, unembed_DV, preferred_element_type=jnp.float32)
        lse_BC = jax.nn.logsumexp(logits_BCV, axis=-1)
        return jnp.take_along_axis(logits_BCV, y_BC[..., None], axis=-1)[..., 0] - lse_BC

    def unsteps(out_KBC):
        return jnp.swapaxes(out_KBC, 0, 1).reshape(b, k * c)[:, :t]

    if mask_BT is None:
        return unsteps(jax.lax.map(jax.checkpoint(lambda a: logprobs(*a)), (h_KBCD, y_KBC)))

    @jax.checkpoint
    def one_step(args):
        h_BCD, y_BC, live_BC = args
        # Rows with fewer wanted positions than others share the step: zero their other positions, so what lies
        # outside the mask (even non-finite values) reaches neither the values nor the gradients.
        h_BCD = jnp.where(live_BC[..., None], h_BCD, jnp.zeros((), h_BCD.dtype))
        return jax.lax.cond(jnp.any(live_BC), lambda: logprobs(h_BCD, y_BC),
                            lambda: jnp.zeros(y_BC.shape, jnp.float32))

    sorted_BT = unsteps(jax.lax.map(one_step, (h_KBCD, y_KBC, steps(live_BT))))
    out_BT = jnp.take_along_axis(sorted_BT, jnp.argsort(order_BT, axis=1), axis=1)  # back to token order
    return jnp.where(keep_BT, out_BT, 0.0)


def token_logprobs(params: Params, cfg: Qwen3Config, tokens_BT: Int[Array, "B T"], targets_BT: Int[Array, "B T"],
                   segment_ids_BT: Int[Array, "B T"] | None = None,
                   positions_BT: Int[Array, "B T"] | None = None, *, chunk: int | None = None,
                   attention_impl: str | None = None, mask_BT: Int[Array, "B T"] | None = None) -> Float[Array, "B T"]:
    """Returns log p(targets[b, t] | tokens[b, :t+1]) for every position (fp32), chunked over the vocabulary matmul.

    Equals ``log_softmax(forward(...))`` gathered at ``targets``. With ``segment_ids`` several sequences are packed
    per row and never attend to each other; positions restart at each segment unless given. With ``mask_BT`` only
    the masked positions are computed (the others are 0; see ``chunked_logprobs``).
    """
    if targets_BT.shape != tokens_BT.shape:
        raise ValueError(f"targets shape {targets_BT.shape} != tokens shape {tokens_BT.shape}")
    hidden, unembed = hidden_states(params, cfg, tokens_BT, positions_BT, segment_ids_BT, attention_impl)
    return chunked_logprobs(hidden, unembed, targets_BT, chunk or cfg.logits_chunk, mask_BT)
