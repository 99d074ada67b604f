"""The weight publish: the trainer's master weights → the sampler's dtype and layout, as one program on device.

The trainer keeps fp32 master weights FSDP-sharded; each engine samples with a bf16 copy on its own device
(``sampling.replicas``). One jitted cast whose output shardings are the sampler's does both: XLA casts where the
weights are sharded (halving what moves) and then performs the reshard (an all-gather within the host), with no
host round trip.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax.sharding import NamedSharding


def publish_fn(dtype: str = "bfloat16", shardings=None):
    """Returns the jitted publish: ``params -> params`` cast to ``dtype`` and laid out by ``shardings`` (a tree of
    ``NamedSharding``s; None: where they are), so XLA performs the cast where the weights are sharded and then the
    reshard (e.g. FSDP shards → a bf16 replica per device: an all-gather within the host). One executable per
    (dtype, layout), traced once."""
    if shardings is None:
        return _publish_jit(jnp.dtype(dtype).name, None, None)
    leaves, treedef = jax.tree.flatten(shardings, is_leaf=lambda x: isinstance(x, NamedSharding))
    return _publish_jit(jnp.dtype(dtype).name, treedef, tuple(leaves))


@functools.lru_cache(maxsize=16)
def _publish_jit(dtype: str, treedef, leaves):
    cast = functools.partial(_cast_tree, dtype=dtype)
    if treedef is None:
        return jax.jit(cast)
    return jax.jit(cast, out_shardings=jax.tree.unflatten(treedef, leaves))


def _cast_tree(params, *, dtype: str):
    return jax.tree.map(lambda x: x.astype(dtype), params)


def publish(params, *, dtype: str = "bfloat16", shardings=None):
    """Returns the parameters cast to ``dtype`` in the sampler's layout (``shardings``; default: where they are).

    Runs on device: a jitted cast whose output shardings are the sampler's, so XLA performs the reshard.
    """
    return publish_fn(dtype, shardings)(params)
