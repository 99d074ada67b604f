"""The engine-facing paged attention: same signature and result as ``sera_jax.sampling.attention.paged_attention``.

Row ``b`` has ``ctx_len[b]`` tokens in the pool and T new tokens (k/v passed directly, not yet in the pool). The
attention splits exactly into two disjoint key sets, merged through their log-sum-exps:
  * cached tokens: the Pallas paged kernel (every new query sees all of them);
  * new tokens, causal among themselves: for decode (T = 1) a query sees only its own key, so that part is one dot
    product per head; for prefill (T > 1) the flash kernel's forward with one segment per row.
"""

from __future__ import annotations

import jax.numpy as jnp
from jaxtyping import Array, Float, Int

from sera_jax.kernels._common import merge_partials
from sera_jax.kernels.flash_attention import flash_attention_with_lse
from sera_jax.kernels.paged_decode import paged_decode_attention


def _new_tokens_part(q_BTHE, k_BTKE, v_BTKE, scale, interpret):
    b, t, h, e = q_BTHE.shape
    g = h // k_BTKE.shape[2]
    if t == 1:
        k = jnp.repeat(k_BTKE, g, axis=2).astype(jnp.float32)
        lse = jnp.sum(q_BTHE.astype(jnp.float32) * k, axis=-1) * scale  # [B, 1, H]: one key, so lse = its score
        return jnp.repeat(v_BTKE, g, axis=2).astype(jnp.float32), lse
    seg = jnp.ones((b, t), jnp.int32)
    return flash_attention_with_lse(q_BTHE, k_BTKE.astype(q_BTHE.dtype), v_BTKE.astype(q_BTHE.dtype), seg,
                                    causal=True, scale=scale, interpret=interpret)


def paged_attention(q_BTHE: Float[Array, "B T H E"], k_BTKE: Float[Array, "B T K E"], v_BTKE: Float[Array, "B T K E"],
                    k_pool: Float[Array, "L N S K E"], v_pool: Float[Array, "L N S K E"], layer: Int[Array, ""],
                    block_table_BW: Int[Array, "B W"], ctx_len_B: Int[Array, "B"], *, num_splits: int = 1,
                    interpret: bool | None = None) -> Float[Array, "B T H E"]:
    """Returns the attention output [B, T, H, E] (q's dtype) of the new queries over cache ++ new keys.

    Drop-in for the engine's reference (same arguments, same result up to fp32 summation order); the kernels run
    compiled on GPU and interpreted elsewhere (``interpret=None``).
    """
    scale = q_BTHE.shape[-1] ** -0.5
    out_c, lse_c = paged_decode_attention(q_BTHE, k_pool, v_pool, layer, block_table_BW, ctx_len_B, scale=scale,
                                          num_splits=num_splits, interpret=interpret)
    out_n, lse_n = _new_tokens_part(q_BTHE, k_BTKE, v_BTKE, scale, interpret)
    out, _ = merge_partials([out_c, out_n], [lse_c, lse_n])
    return out.astype(q_BTHE.dtype)
