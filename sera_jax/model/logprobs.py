"""Per-token log-probabilities without materialising [tokens × vocab] logits for the whole sequence.

A 60k-token micro-batch against Qwen3's 151,936-entry vocabulary would be 36 GB of fp32 logits. Instead the
flattened tokens are cut into chunks of ``chunk`` tokens; each chunk's logits exist only inside a rematerialised
(``jax.checkpoint``) body of a ``lax.map``, so forward and backward both hold one chunk's logits at a time.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jaxtyping import Array, Float, Int

from sera_jax.model.config import Qwen3Config
from sera_jax.model.qwen3 import Params, hidden_states


def chunked_logprobs(hidden_BTD: Float[Array, "B T D"], unembed_DV: Float[Array, "D V"],
                     targets_BT: Int[Array, "B T"], chunk: int) -> Float[Array, "B T"]:
    """Returns log softmax(hidden @ unembed)[target] per token (fp32), computed ``chunk`` tokens at a time."""
    b, t, d = hidden_BTD.shape
    n = b * t
    num_chunks = -(-n // chunk)
    pad = num_chunks * chunk - n
    h = jnp.pad(hidden_BTD.reshape(n, d), ((0, pad), (0, 0))).reshape(num_chunks, chunk, d)
    y = jnp.pad(targets_BT.reshape(n), (0, pad)).reshape(num_chunks, chunk)

    @jax.checkpoint
    def one_chunk(args):
        h_cd, y_c = args
        logits_cv = jnp.einsum("cd,dv->cv", h_cd, unembed_DV, preferred_element_type=jnp.float32)
        lse_c = jax.nn.logsumexp(logits_cv, axis=-1)
        picked_c = jnp.take_along_axis(logits_cv, y_c[:, None], axis=-1)[:, 0]
        return picked_c - lse_c

    out = jax.lax.map(one_chunk, (h, y))
    return out.reshape(num_chunks * chunk)[:n].reshape(b, t)


def token_logprobs(params: Params, cfg: Qwen3Config, tokens_BT: Int[Array, "B T"], targets_BT: Int[Array, "B T"],
                   segment_ids_BT: Int[Array, "B T"] | None = None,
                   positions_BT: Int[Array, "B T"] | None = None, *, chunk: int | None = None,
                   attention_impl: str | None = None) -> Float[Array, "B T"]:
    """Returns log p(targets[b, t] | tokens[b, :t+1]) for every position (fp32), chunked over the vocabulary matmul.

    Equals ``log_softmax(forward(...))`` gathered at ``targets``. With ``segment_ids`` several sequences are packed
    per row and never attend to each other; positions restart at each segment unless given.
    """
    if targets_BT.shape != tokens_BT.shape:
        raise ValueError(f"targets shape {targets_BT.shape} != tokens shape {tokens_BT.shape}")
    hidden, unembed = hidden_states(params, cfg, tokens_BT, positions_BT, segment_ids_BT, attention_impl)
    return chunked_logprobs(hidden, unembed, targets_BT, chunk or cfg.logits_chunk)
