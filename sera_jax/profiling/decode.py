"""Profile the rollout engine's decode chunks: compile time, time per chunk, decode tokens/s, MFU, HBM roofline.

One batch of ``batch`` prompts of ``prompt_len`` random tokens is generated with ``max_new_tokens = chunks ×
chunk_steps + 1`` (the first token comes from the prefill, then exactly ``chunks`` decode chunks per row, each one
jitted ``lax.while_loop`` of ``chunk_steps`` steps), temperature 1, no stop. A prefill-only run of the same
prompts (``max_new_tokens=1``) is timed first and subtracted, so the decode figures isolate the chunks. The
engine is given one bucket per shape, so ``Engine.warmup()`` compiles exactly the executables the runs use; its
time is the compile time. FLOP and roofline definitions: ``profiling.flops``.
"""

from __future__ import annotations

import asyncio
import dataclasses
import time
from typing import Any

from sera_jax.model import Qwen3Config, init_params
from sera_jax.profiling.flops import (
    HBM_BYTES_PER_S,
    PEAK_FLOPS,
    decode_flops,
    kv_bytes_per_token,
    peak_memory_bytes,
)
from sera_jax.profiling.trace import profiler_trace
from sera_jax.sampling import Engine, EngineConfig, SamplingParams


@dataclasses.dataclass(frozen=True)
class DecodeShape:
    """The profiled decode: ``batch`` rows, prompts of ``prompt_len`` tokens, ``chunk_steps`` tokens per chunk."""

    preset: str = "qwen3-4b-instruct-2507"
    batch: int = 64
    prompt_len: int = 1024
    chunk_steps: int = 32
    block_size: int = 16
    dtype: str = "bfloat16"

    @classmethod
    def tiny(cls) -> "DecodeShape":
        """Returns the CPU shape CI runs in seconds (the tiny preset)."""
        return cls(preset="tiny", batch=4, prompt_len=24, chunk_steps=4, block_size=8)


def _engine_config(shape: DecodeShape, chunks: int, tiny: bool):
    ctx = shape.prompt_len + chunks * shape.chunk_steps + 1
    width = -(-ctx // shape.block_size)
    opts = (("xla_backend_optimization_level", 0), ("xla_llvm_disable_expensive_passes", True)) if tiny else ()
    plen = max(16, 1 << (shape.prompt_len - 1).bit_length())
    pbatch = min(shape.batch, max(1, 8192 // plen))
    return EngineConfig(max_batch=shape.batch, block_size=shape.block_size, num_blocks=shape.batch * width + 2,
                        max_context=width * shape.block_size, chunk_steps=shape.chunk_steps, max_prefill_len=plen,
                        max_prefill_batch=pbatch, max_prefill_tokens=pbatch * plen, dtype=shape.dtype,
                        prefix_caching=False, batch_buckets=(shape.batch,), prefill_batch_buckets=(pbatch,),
                        prefill_len_buckets=(plen,), width_buckets=(width,), compiler_options=opts)


def profile_decode(shape: DecodeShape, *, chunks: int, trace_dir=None, tiny: bool = False,
                   peak_tflops: float | None = None, seed: int = 0) -> dict[str, Any]:
    """Runs the decode profile above on one device (the engine's default placement; the full run is traced into
    ``trace_dir`` when given). Returns a dict: ``compile_s`` (warm-up compilation), ``prefill_s``, ``decode_s``,
    ``chunks`` (per row), ``chunks_dispatched`` (decode calls, ≥ chunks: rows prefilled in several calls join
    late, and a chunk may be in flight when the last row finishes), ``chunk_s`` (decode_s / chunks), ``tokens``
    (decoded), ``tok_s``, ``flops``, ``mfu``,
    ``roofline`` (fraction of the HBM bound; None off GPU), ``peak_mem_bytes``, ``new_compiles`` (must be 0)."""
    import jax
    import numpy as np

    backend = jax.default_backend()
    cfg = Qwen3Config.preset(shape.preset, dtype=shape.dtype, param_dtype=shape.dtype)
    ec = _engine_config(shape, chunks, tiny)
    t0 = time.perf_counter()
    params = jax.jit(init_params, static_argnums=1)(jax.random.key(seed), cfg)
    engine = Engine(cfg, params, ec)
    del params
    init_s = time.perf_counter() - t0
    try:
        t0 = time.perf_counter()
        engine.warmup()
        compile_s = time.perf_counter() - t0
        rs = np.random.RandomState(seed)
        prompts = [rs.randint(0, cfg.vocab_size, shape.prompt_len).tolist() for _ in range(shape.batch)]
        new = chunks * shape.chunk_steps + 1

        def run(max_new: int):
            sp = SamplingParams(max_new_tokens=max_new, temperature=1.0)

            async def main():
                return await asyncio.gather(*[engine.generate(p, sp, key=jax.random.key(i))
                                              for i, p in enumerate(prompts)])
            t = time.perf_counter()
            res = asyncio.run(main())
            return time.perf_counter() - t, res

        c0 = engine.compile_count()
        prefill_s, _ = run(1)
        calls0 = engine.stats()["decode_calls"]
        with profiler_trace(trace_dir):
            all_s, res = run(new)
        n_chunks = engine.stats()["decode_calls"] - calls0
        new_compiles = engine.compile_count() - c0
    finally:
        engine.close()
    generated = [len(r.token_ids) for r in res]
    if any(g != new for g in generated):
        raise AssertionError(f"rows generated {sorted(set(generated))} tokens, expected {new}")
    decoded = shape.batch * (new - 1)
    decode_s = max(all_s - prefill_s, 1e-9)
    flops = decode_flops(cfg, [shape.prompt_len + i for i in range(1, new) for _ in range(shape.batch)])
    peak = peak_tflops * 1e12 if peak_tflops else PEAK_FLOPS.get(backend)
    step_s = decode_s / (new - 1)
    itemsize = np.dtype(cfg.compute_dtype).itemsize
    ctx_mean = shape.prompt_len + new / 2
    step_bytes = cfg.num_params() * itemsize + shape.batch * ctx_mean * kv_bytes_per_token(cfg, itemsize)
    bw = HBM_BYTES_PER_S.get(backend)
    return {
        "kind": "decode", "backend": backend, "device_kind": jax.devices()[0].device_kind, "devices": 1,
        "preset": shape.preset, "params": cfg.num_params(), "dtype": shape.dtype, "batch": shape.batch,
        "prompt_len": shape.prompt_len, "chunk_steps": shape.chunk_steps, "new_tokens": new,
        "init_s": init_s, "compile_s": compile_s, "prefill_s": prefill_s, "total_s": all_s, "decode_s": decode_s,
        "chunks": chunks, "chunks_dispatched": n_chunks, "chunk_s": decode_s / chunks, "step_s": step_s,
        "tokens": decoded,
        "tok_s": decoded / decode_s, "flops": flops, "peak_flops": peak,
        "mfu": flops / decode_s / peak if peak else None, "step_bytes": step_bytes,
        "roofline": (step_bytes / bw) / step_s if bw else None,
        "peak_mem_bytes": peak_memory_bytes(jax.devices()[:1]), "new_compiles": new_compiles,
    }
