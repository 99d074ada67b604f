"""The rollout engine's executables and the weight publish, compiled for a described GPU without one.

The engine's own jitted functions (``sampling.engine.device_functions``: prefill past the cached prefix, the first
token's sampler, the decode chunk's ``while_loop``) are lowered on abstract arguments — bf16 weights, the KV pool a
config allocates, the row state — at every shape bucket the engine can compile, on one deviceless GPU (an engine
owns one device: ``sampling.replicas``), with the Pallas paged-attention kernel selected. The publish is the
trainer → sampler reshard: the FSDP-sharded fp32 master weights cast to bf16 and replicated on every device.
"""

from __future__ import annotations

import dataclasses
import itertools
import time
from typing import Any, Iterator

import jax
import jax.numpy as jnp
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from sera_jax.kernels._common import target_backend
from sera_jax.model import Qwen3Config, abstract_params
from sera_jax.model.sharding import param_shardings
from sera_jax.parallel.mesh import MeshConfig, activate, make_mesh
from sera_jax.parallel.rules import SAMPLE_RULES, TRAIN_RULES, Rules
from sera_jax.profiling.aot_step import CompiledProgram, memory_of
from sera_jax.sampling.device_loop import RowState, row_config_spec
from sera_jax.sampling.engine import device_functions
from sera_jax.sampling.engine_config import EngineConfig
from sera_jax.sampling.paged_cache import pool_shape
from sera_jax.sampling.publish import publish_fn


def sampler_config(model_cfg: Qwen3Config, engine: EngineConfig) -> Qwen3Config:
    """Returns the model config the engine runs (its dtype for weights, activations and KV; no remat)."""
    return model_cfg.replace(dtype=engine.dtype, param_dtype=engine.dtype, remat=False)


def engine_shapes(engine: EngineConfig, *, every_bucket: bool = True) -> Iterator[tuple[str, tuple[int, ...]]]:
    """Yields ("prefill", (rows, tokens, ctx blocks)), ("start", (rows,)) and ("decode", (rows, width blocks)) for
    every shape the engine compiles (``Engine.warmup``'s set), or with ``every_bucket=False`` the largest of each
    (the ones that bound memory)."""
    bk = engine.buckets()
    prefills = [(b, t, c) for b, t, c in itertools.product(bk["prefill_batch"], bk["prefill_len"], bk["prefill_ctx"])
                if not (b > bk["prefill_batch"][0] and b * t > engine.max_prefill_tokens)]
    decodes = list(itertools.product(bk["batch"], bk["width"]))
    if not every_bucket:
        prefills = [max(prefills, key=lambda s: (s[0] * s[1], s[2]))]
        decodes = [decodes[-1]]
    for s in prefills:
        yield "prefill", s
    for b in sorted({s[0] for s in prefills}):
        yield "start", (b,)
    for s in decodes:
        yield "decode", s


@dataclasses.dataclass
class EngineCompile:
    """Every engine executable compiled, and what the engine holds on its device."""

    config: EngineConfig
    programs: list[CompiledProgram]
    weights_bytes: int
    pool_bytes: int
    state_bytes: int

    @property
    def peak_temp_bytes(self) -> int:
        """The largest temporary buffer plan of any executable (the pool and weights are arguments, donated)."""
        return max(p.memory["temp"] for p in self.programs)

    @property
    def resident_bytes(self) -> int:
        """Bytes the engine keeps on its device between calls: weights, KV pool, row state."""
        return self.weights_bytes + self.pool_bytes + self.state_bytes


def _sds(shape, dtype, sharding) -> jax.ShapeDtypeStruct:
    return jax.ShapeDtypeStruct(tuple(shape), dtype, sharding=sharding)


def compile_engine(model_cfg: Qwen3Config, engine: EngineConfig, device: Any, *, every_bucket: bool = True,
                   keep_executables: bool = False, rules: Rules = SAMPLE_RULES) -> EngineCompile:
    """Returns the engine's executables compiled for ``device`` (a deviceless GPU) at its shape buckets."""
    cfg = sampler_config(model_cfg, engine)
    mesh = make_mesh(MeshConfig(1, 1, 1), [device])
    fns = device_functions(cfg, engine, mesh, rules)
    rep = fns.replicated
    p_sh = param_shardings(cfg, mesh, rules)
    params = jax.tree.map(lambda a, s: _sds(a.shape, a.dtype, s), abstract_params(cfg), p_sh)
    pshape = pool_shape(cfg, engine.num_blocks, engine.block_size)
    pool = {k: _sds(pshape, cfg.compute_dtype, fns.pool_sharding) for k in ("k", "v")}
    r = engine.buckets()["batch"][-1]
    state = RowState(token=_sds((r,), jnp.int32, rep), len=_sds((r,), jnp.int32, rep),
                     n_gen=_sds((r,), jnp.int32, rep), done=_sds((r,), jnp.bool_, rep),
                     recent=_sds((r, engine.stop_seq_len), jnp.int32, rep))
    w_max = engine.max_blocks_per_seq

    def i32(*shape):
        return _sds(shape, jnp.int32, rep)

    def rows_cfg(b):
        spec = row_config_spec(b, engine.max_stop_ids, engine.max_stop_seqs, engine.stop_seq_len)
        return {k: _sds(s, dt, rep) for k, (s, dt) in spec.items()}

    programs = []
    with target_backend("gpu"), activate(mesh, rules):
        for kind, shape in engine_shapes(engine, every_bucket=every_bucket):
            if kind == "prefill":
                b, t, c = shape
                low = fns.prefill.lower(params, pool, i32(b, t), i32(b), i32(b), i32(b, w_max), i32(b, c))
            elif kind == "start":
                (b,) = shape
                low = fns.start.lower(state, _sds((b, cfg.vocab_size), jnp.float32, rep), i32(b), i32(b), i32(b),
                                      rows_cfg(b))
            else:
                b, w = shape
                low = fns.decode.lower(params, pool, state, i32(b), i32(b, w), _sds((b,), jnp.bool_, rep),
                                       rows_cfg(b))
            t0 = time.perf_counter()
            compiled = low.compile()
            programs.append(CompiledProgram(f"{kind}{list(shape)}", time.perf_counter() - t0, memory_of(compiled),
                                            compiled.as_text(), compiled if keep_executables else None))
    nbytes = lambda tree: sum(x.size * jnp.dtype(x.dtype).itemsize for x in jax.tree.leaves(tree))
    return EngineCompile(engine, programs, nbytes(params), nbytes(pool), nbytes(state))


def compile_publish(model_cfg: Qwen3Config, train_mesh: Mesh, *, dtype: str = "bfloat16",
                    rules: Rules = TRAIN_RULES, keep_executable: bool = False) -> CompiledProgram:
    """Returns the publish compiled for ``train_mesh``: fp32 FSDP-sharded master weights → ``dtype`` weights
    replicated on every device (what each device's engine loads; ``sampling.replicas``)."""
    master = model_cfg.replace(param_dtype="float32")
    p_sh = param_shardings(master, train_mesh, rules)
    params = jax.tree.map(lambda a, s: _sds(a.shape, a.dtype, s), abstract_params(master), p_sh)
    out = jax.tree.map(lambda _: NamedSharding(train_mesh, PartitionSpec()), p_sh)
    t0 = time.perf_counter()
    with target_backend("gpu"), activate(train_mesh, rules):
        compiled = publish_fn(dtype, out).lower(params).compile()
    return CompiledProgram("publish", time.perf_counter() - t0, memory_of(compiled), compiled.as_text(),
                           compiled if keep_executable else None)
