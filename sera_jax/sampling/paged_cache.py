"""The paged KV cache on device: a preallocated pool of fixed-size blocks, and writing new keys/values into it.

The pool is ``{"k", "v"}``, each [layers, num_blocks, block_size, kv_heads, head_dim] in the sampler's compute dtype,
laid out by the logical names ``("layers", "cache_blocks", None, "cache_kv_heads", "head_dim")`` (``SAMPLE_RULES``
put kv heads on ``tensor``). Which block belongs to which sequence is host bookkeeping (``block_manager``); device
code sees only block tables.

Block 0 is never handed out: it is the trash block. Padding tokens, padding rows and finished rows write there, so
every write is an unconditional scatter of a static shape and no real block is ever touched by a masked token.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jax.sharding import Mesh, NamedSharding, PartitionSpec
from jaxtyping import Array, Float, Int

from sera_jax.model.config import Qwen3Config
from sera_jax.parallel.rules import Rules, check_divisible, mesh_spec

POOL_LOGICAL = ("layers", "cache_blocks", None, "cache_kv_heads", "head_dim")
TRASH_BLOCK = 0

Pool = dict[str, jax.Array]


def pool_shape(cfg: Qwen3Config, num_blocks: int, block_size: int) -> tuple[int, ...]:
    """Returns the shape of one of the pool's two arrays."""
    return (cfg.num_layers, num_blocks, block_size, cfg.num_kv_heads, cfg.head_dim)


def pool_sharding(mesh: Mesh, rules: Rules) -> NamedSharding:
    """Returns the sharding of the pool arrays on ``mesh`` under ``rules``."""
    return NamedSharding(mesh, mesh_spec(PartitionSpec(*POOL_LOGICAL), rules))


def make_pool(cfg: Qwen3Config, num_blocks: int, block_size: int, dtype, mesh: Mesh, rules: Rules) -> Pool:
    """Returns a zeroed pool ``{"k", "v"}`` placed on ``mesh`` (raises ValueError if the mesh does not divide it)."""
    shape = pool_shape(cfg, num_blocks, block_size)
    check_divisible(jax.ShapeDtypeStruct(shape, dtype), PartitionSpec(*POOL_LOGICAL), mesh, rules)
    sharding = pool_sharding(mesh, rules)
    zeros = jax.jit(lambda: jnp.zeros(shape, dtype), out_shardings=sharding)
    return {"k": zeros(), "v": zeros()}


def write_slots(block_table_BW: Int[Array, "B W"], positions_BT: Int[Array, "B T"], valid_BT, block_size: int):
    """Returns the flat pool slot (block * block_size + offset) of each token; invalid tokens go to the trash block."""
    col = positions_BT // block_size
    blk = jnp.take_along_axis(block_table_BW, jnp.clip(col, 0, block_table_BW.shape[1] - 1), axis=1)
    slot = blk * block_size + positions_BT % block_size
    # A position past the table (never planned by the scheduler) must not land in some other block: trash it.
    return jnp.where(valid_BT & (col < block_table_BW.shape[1]), slot, TRASH_BLOCK * block_size)


def write_kv(pool: Pool, new_k_LBTKE: Float[Array, "L B T K E"], new_v_LBTKE: Float[Array, "L B T K E"],
             slots_BT: Int[Array, "B T"]) -> Pool:
    """Returns the pool with every layer's new keys/values scattered into ``slots`` (one scatter per array).

    Called once after the layer scan (not inside it), so under buffer donation the update is in place.
    """
    out = {}
    for name, new in (("k", new_k_LBTKE), ("v", new_v_LBTKE)):
        arr = pool[name]
        l, n, s, kv, e = arr.shape
        flat = arr.reshape(l, n * s, kv, e)
        flat = flat.at[:, slots_BT.reshape(-1)].set(new.reshape(l, -1, kv, e).astype(arr.dtype))
        out[name] = flat.reshape(l, n, s, kv, e)
    return out
