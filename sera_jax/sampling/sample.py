"""Choosing the next token per row: greedy / temperature / top-p, each row with its own key; behaviour logprobs.

The logprob returned for a token is always under the policy at temperature 1 (``log_softmax(logits)``), whatever
temperature or nucleus sampled it: that is CISPO's behaviour logprob, which the trainer's ``token_logprobs``
recomputes for the same tokens.

Row ``b``'s randomness is ``fold_in(key[b], step[b])`` where ``step`` counts the tokens that row has generated, so a
request's samples depend only on its own key and history, never on which other rows share the batch.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jaxtyping import Array, Float, Int, UInt32


def _top_p_mask(logits_BV: jax.Array, top_p_B: jax.Array) -> jax.Array:
    """Returns logits with everything outside each row's nucleus set to -inf (the top token always survives)."""
    order = jnp.argsort(-logits_BV, axis=-1)
    sorted_logits = jnp.take_along_axis(logits_BV, order, axis=-1)
    probs = jax.nn.softmax(sorted_logits, axis=-1)
    # Keep a token if the mass strictly before it is below top_p: the smallest prefix reaching top_p.
    before = jnp.cumsum(probs, axis=-1) - probs
    keep_sorted = before < top_p_B[:, None]
    keep = jnp.zeros_like(keep_sorted).at[jnp.arange(logits_BV.shape[0])[:, None], order].set(keep_sorted)
    return jnp.where(keep, logits_BV, -jnp.inf)


def _first_argmax(x_BV: jax.Array) -> jax.Array:
    """Returns the index of each row's first maximum [B] int32 (``jnp.argmax`` for finite x). Two plain reductions,
    which XLA's CPU backend vectorises; its variadic argmax reduction is several times slower at vocab size."""
    m = jnp.max(x_BV, axis=-1, keepdims=True)
    iota = jax.lax.broadcasted_iota(jnp.int32, x_BV.shape, x_BV.ndim - 1)
    return jnp.min(jnp.where(x_BV == m, iota, x_BV.shape[-1]), axis=-1)


def sample_tokens(logits_BV: Float[Array, "B V"], temperature_B: Float[Array, "B"], top_p_B: Float[Array, "B"],
                  key_data_B2: UInt32[Array, "B 2"], step_B: Int[Array, "B"]):
    """Returns (tokens [B] int32, logprobs [B] fp32 at temperature 1).

    Rows with temperature 0 take the argmax. The others sample from softmax(logits / T) restricted to the top-p
    nucleus (the sort is skipped when no row asks for top_p < 1, and the draws when every row is greedy).
    ``key_data_B2`` is raw threefry key data.
    """
    logits = logits_BV.astype(jnp.float32)
    greedy = _first_argmax(logits)

    def draw_rows(logits, temperature_B, top_p_B, key_data_B2, step_B):
        safe_t = jnp.where(temperature_B > 0, temperature_B, 1.0)
        scaled = logits / safe_t[:, None]
        scaled = jax.lax.cond(jnp.any(top_p_B < 1.0), _top_p_mask, lambda x, _: x, scaled, top_p_B)

        def draw(kd, step, row):
            key = jax.random.fold_in(jax.random.wrap_key_data(kd), step)
            return jax.random.categorical(key, row)

        return jax.vmap(draw)(key_data_B2, step_B, scaled).astype(jnp.int32)

    sampled = jax.lax.cond(jnp.any(temperature_B > 0), draw_rows, lambda *_: greedy, logits, temperature_B, top_p_B,
                           key_data_B2, step_B)
    tokens = jnp.where(temperature_B > 0, sampled, greedy)
    # log_softmax at the chosen token only: logit - logsumexp(logits).
    logprobs = jnp.take_along_axis(logits, tokens[:, None], axis=-1)[:, 0] - _logsumexp(logits)
    return tokens, logprobs


def _logsumexp(logits_BV: jax.Array) -> jax.Array:
    """Returns each row's log(sum(exp(logits))) [B], shifted by its max (the softmax's normaliser)."""
    m = jnp.max(logits_BV, axis=-1)
    return m + jnp.log(jnp.sum(jnp.exp(logits_BV - m[:, None]), axis=-1))


def top_logprobs(logits_BV: Float[Array, "B V"], k: int) -> tuple[Int[Array, "B k"], Float[Array, "B k"]]:
    """Returns (ids [B, k] int32, logprobs [B, k] fp32) of each row's ``k`` most likely tokens under the policy at
    temperature 1, most likely first (OpenAI's ``top_logprobs``); ``k`` = 0 gives empty arrays and computes nothing."""
    b = logits_BV.shape[0]
    if k == 0:
        return jnp.zeros((b, 0), jnp.int32), jnp.zeros((b, 0), jnp.float32)
    logits = logits_BV.astype(jnp.float32)
    values, ids = jax.lax.top_k(logits, k)
    return ids.astype(jnp.int32), values - _logsumexp(logits)[:, None]
