"""Per-token log-probabilities without materialising [tokens × vocab] logits for the whole sequence.

A 60k-token micro-batch against Qwen3's 151,936-entry vocabulary would be 36 GB of fp32 logits. Instead the
head runs in steps of about ``chunk`` tokens per device (the same positions of every row); each step's logits
exist only inside a rematerialised (``jax.checkpoint``) body of a ``lax.map``, so forward and backward both hold one
step's logits at a time.
"""

from __future__ import annotations

import flax.linen as nn
import jax
import jax.numpy as jnp
from jaxtyping import Array, Float, Int

from sera_jax.model.config import Qwen3Config
from sera_jax.model.qwen3 import Params, hidden_states
from sera_jax.parallel.rules import ambient_shards


def chunked_logprobs(hidden_BTD: Float[Array, "B T D"], unembed_DV: Float[Array, "D V"],
                     targets_BT: Int[Array, "B T"], chunk: int,
                     mask_BT: Int[Array, "B T"] | None = None) -> Float[Array, "B T"]:
    """Returns log softmax(hidden @ unembed)[target] per token (fp32), about ``chunk`` tokens per device at a time.

    Each step of the loop takes the same ``c`` positions of every row: logits [B, c, V], with the row axis split
    over the mesh like the rest of the batch (``c`` = ``chunk`` / rows per device, so ``chunk`` bounds one device's
    logits). The loop runs along the length axis, never along the (sharded) row axis: a loop over rows would make
    XLA split the hidden size instead and all-reduce every chunk's partial [c, V] logits. The unembedding is
    gathered whole on the embed axis once, before the loop.

    With ``mask_BT`` only the masked positions are wanted (the loss tokens of a training batch; prompts and padding
    are not): each row's masked positions are moved to its front (a stable per-row sort), a step where no row has
    any is skipped (``lax.cond``, forward and backward), and unmasked positions return 0 (their hidden states never
    enter the matmul). In agent rollouts most tokens are prompt, so most of the [tokens × vocab] head matmul is
    skipped; the wanted values are the same function.
    """
    b, t, d = hidden_BTD.shape
    h_BTD, y_BT = hidden_BTD, targets_BT
    if mask_BT is not None:
        if mask_BT.shape != targets_BT.shape:
            raise ValueError(f"mask shape {mask_BT.shape} != targets shape {targets_BT.shape}")
        keep_BT = mask_BT > 0
        order_BT = jnp.argsort(~keep_BT, axis=1, stable=True)  # each row's wanted positions first, in order
        h_BTD = jnp.take_along_axis(hidden_BTD, order_BT[..., None], axis=1)
        y_BT = jnp.take_along_axis(targets_BT, order_BT, axis=1)
        live_BT = jnp.take_along_axis(keep_BT, order_BT, axis=1)
    rows_per_device = -(-b // ambient_shards("batch"))
    c = max(1, min(t, chunk // rows_per_device))  # positions of each row per step
    k = -(-t // c)
    pad = k * c - t

    def steps(x_BT_):  # [B, T, ...] -> [k, B, c, ...]: the loop axis first, rows kept whole in each step
        x = jnp.pad(x_BT_, ((0, 0), (0, pad)) + ((0, 0),) * (x_BT_.ndim - 2))
        return jnp.swapaxes(x.reshape(b, k, c, *x_BT_.shape[2:]), 0, 1)

    h_KBCD = nn.with_logical_constraint(steps(h_BTD), (None, "batch", "length", "act_embed"))
    y_KBC = steps(y_BT)
    unembed_DV = nn.with_logical_constraint(unembed_DV, ("act_embed", "vocab"))

    def logprobs(h_BCD, y_BC):
        logits_BCV = jnp.einsum("bcd,dv->bcv", h_BCD, unembed_DV, preferred_element_type=jnp.float32)
        logits_BCV = nn.with_logical_constraint(logits_BCV, ("batch", "length", "vocab"))
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
