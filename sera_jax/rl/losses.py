"""Policy losses on per-token logprobs, registered by name (docs/design/algorithm.md §6).

Both losses are a sum over loss-masked tokens divided by ``num_tokens``, the number of loss-masked tokens of the
*whole optimizer step* (all micro-batches, all ranks). Passing that global count to every micro-batch makes the
sum of micro-batch losses (and gradients) equal the loss of the unsplit batch, whatever the split.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
from jaxtyping import Array, Float

__all__ = ["StepConfig", "importance_ratio", "cispo_loss", "pg_loss", "LOSSES", "register_loss", "get_loss",
           "loss_on_batch"]

LossFn = Callable[..., Float[Array, ""]]
LOSSES: dict[str, LossFn] = {}


@dataclasses.dataclass(frozen=True)
class StepConfig:
    """The loss of a training step (a name in ``LOSSES``), CISPO's ratio clip, and the advantage sign."""

    loss: str = "cispo"
    ratio_min: float = 0.0
    ratio_max: float = 5.0
    # -1 flips every advantage: the control run that must not improve (a sanity check of the learning signal).
    advantage_sign: float = 1.0

    def __post_init__(self) -> None:
        if self.advantage_sign not in (1.0, -1.0):
            raise ValueError(f"advantage_sign must be 1 or -1, got {self.advantage_sign}")


def register_loss(name: str) -> Callable[[LossFn], LossFn]:
    """Returns a decorator that files a loss under ``name`` in ``LOSSES``."""
    def deco(fn: LossFn) -> LossFn:
        if name in LOSSES:
            raise ValueError(f"loss {name!r} already registered")
        LOSSES[name] = fn
        return fn
    return deco


def get_loss(name: str) -> LossFn:
    """Returns the loss registered as ``name`` ("cispo", "pg")."""
    try:
        return LOSSES[name]
    except KeyError:
        raise KeyError(f"unknown loss {name!r}; registered: {sorted(LOSSES)}") from None


def _denominator(mask: Array, num_tokens: Any) -> Array:
    n = jnp.sum(mask) if num_tokens is None else jnp.asarray(num_tokens, jnp.float32)
    return jnp.maximum(n.astype(jnp.float32), 1.0)  # an all-padding batch contributes 0, not NaN


def importance_ratio(logp: Float[Array, "B T"], old_logp: Float[Array, "B T"], mask: Array) -> Float[Array, "B T"]:
    """Returns CISPO's per-token importance ratio exp(logp − old_logp) on the positions where ``mask`` (bool) holds,
    1 elsewhere: the one definition the loss and the step's clip statistics share."""
    # where (not multiply): padded positions may hold −inf logprobs and must not turn the sum into NaN.
    return jnp.exp(jnp.where(mask, logp - old_logp, 0.0))


@register_loss("cispo")
@jax.jit
def cispo_loss(logp: Float[Array, "B T"], old_logp: Float[Array, "B T"], advantages: Float[Array, "B T"],
               mask: Float[Array, "B T"], *, ratio_min: float = 0.0, ratio_max: float = 5.0,
               num_tokens: Any = None) -> Float[Array, ""]:
    """Returns the CISPO loss Σ_masked −sg(clip(exp(logp − old_logp), ratio_min, ratio_max))·A·logp / num_tokens
    (num_tokens defaults to this batch's masked-token count). Its gradient w.r.t. logp is −clip(ρ)·A/N on masked
    tokens and 0 elsewhere."""
    m = mask.astype(bool)
    ratio = importance_ratio(logp, old_logp, m)
    coef = jax.lax.stop_gradient(jnp.clip(ratio, ratio_min, ratio_max))
    per_token = jnp.where(m, -coef * advantages * logp, 0.0)
    return jnp.sum(per_token) / _denominator(m, num_tokens)


@register_loss("pg")
@jax.jit
def pg_loss(logp: Float[Array, "B T"], old_logp: Float[Array, "B T"], advantages: Float[Array, "B T"],
            mask: Float[Array, "B T"], *, num_tokens: Any = None, **_: Any) -> Float[Array, ""]:
    """Returns the plain policy-gradient loss Σ_masked −A·logp / num_tokens (behaviour logprobs unused)."""
    m = mask.astype(bool)
    return jnp.sum(jnp.where(m, -advantages * logp, 0.0)) / _denominator(m, num_tokens)


def loss_on_batch(logp: Float[Array, "B T"], batch: Any, name: str = "cispo", **kw: Any) -> Float[Array, ""]:
    """Returns the named loss of ``logp`` against a ``rl.batch.MicroBatch`` (its old logprobs, advantages, loss
    mask and global token count)."""
    return get_loss(name)(logp, batch.old_logprobs, batch.advantages, batch.loss_mask,
                          num_tokens=batch.num_tokens, **kw)
