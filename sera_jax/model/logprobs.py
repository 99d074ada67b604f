"""Per-token log-probabilities without materialising [tokens × vocab] logits for the whole sequence.

A 60k-token micro-batch against Qwen3's 151,936-entry vocabulary would be 36 GB of fp32 logits. Instead the
rows are cut into chunks of ``chunk`` positions; each chunk's logits exist only inside a rematerialised
(``jax.checkpoint``) body of a ``lax.map``, so forward and backward both hold one chunk's logits at a time.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jaxtyping import Array, Float, Int

from sera_jax.model.config import Qwen3Config
from sera_jax.model.qwen3 import Params, hidden_states


def chunked_logprobs(hidden_BTD: Float[Array, "B T D"], unembed_DV: Float[Array, "D V"],
                     targets_BT: Int[Array, "B T"], chunk: int,
                     mask_BT: Int[Array, "B T"] | None = None) -> Float[Array, "B T"]:
    """Returns log softmax(hidden @ unembed)[target] per token (fp32), ``chunk`` positions of one row at a time.

    With ``mask_BT`` only the masked positions are wanted (the loss tokens of a training batch; prompts and padding
    are not): each row's masked positions are moved to its front (a stable per-row sort), a chunk without any is
    skipped (``lax.cond``, forward and backward), and unmasked positions return 0. In agent rollouts most tokens are
    prompt, so most of the [tokens × vocab] head matmul is skipped; the wanted values are the same function.
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
    c = min(chunk, t)  # positions per chunk, all from one row
    k = -(-t // c)
    pad = k * c - t
    h_NCD = jnp.pad(h_BTD, ((0, 0), (0, pad), (0, 0))).reshape(b * k, c, d)
    y_NC = jnp.pad(y_BT, ((0, 0), (0, pad))).reshape(b * k, c)

    def logprobs(h_CD, y_C):
        logits_CV = jnp.einsum("cd,dv->cv", h_CD, unembed_DV, preferred_element_type=jnp.float32)
        lse_C = jax.nn.logsumexp(logits_CV, axis=-1)
        return jnp.take_along_axis(logits_CV, y_C[:, None], axis=-1)[:, 0] - lse_C

    if mask_BT is None:
        out_NC = jax.lax.map(jax.checkpoint(lambda a: logprobs(*a)), (h_NCD, y_NC))
        return out_NC.reshape(b, k * c)[:, :t]

    live_NC = jnp.pad(live_BT, ((0, 0), (0, pad))).reshape(b * k, c)

    @jax.checkpoint
    def one_chunk(args):
        h_CD, y_C, live_C = args
        return jax.lax.cond(jnp.any(live_C), lambda: logprobs(h_CD, y_C), lambda: jnp.zeros(y_C.shape, jnp.float32))

    sorted_BT = jax.lax.map(one_chunk, (h_NCD, y_NC, live_NC)).reshape(b, k * c)[:, :t]
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
