"""The sampling engines a run builds: how many per host, each one's rows, and its KV pool within a share of device
memory."""

from __future__ import annotations

from typing import Any, Sequence

import jax

from sera_jax.assembly.concurrency import groups_in_flight
from sera_jax.config import ConfigError, RunConfig
from sera_jax.sampling import EngineConfig
from sera_jax.sampling.engine_config import cpu_shapes

KV_FRACTION = 0.35         # of each device's memory for the policy engines' KV pools
JUDGE_KV_FRACTION = 0.05   # of the first device's, taken from the above, for a policy_frozen judge's engine


def num_engines(cfg: RunConfig, local_devices: Sequence[Any]) -> int:
    """Returns how many sampling engines this host runs (``rollout.engines``; null = every local GPU, 1 on CPU,
    where fake devices share the same cores). Raises ConfigError when the host has fewer devices."""
    n = cfg.rollout.engines
    if n is None:
        return len(local_devices) if jax.default_backend() == "gpu" else 1
    if n > len(local_devices):
        raise ConfigError(f"rollout.engines: {n} engines need {n} local devices, this host has {len(local_devices)}")
    return n


def engine_config(cfg: RunConfig, model_dtype: str, engines: int = 1, kv_fraction: float = KV_FRACTION, *,
                  backend: str | None = None, bytes_limit: int | None = None, evaluation: bool = False,
                  model_cfg: Any = None) -> EngineConfig:
    """Returns one engine's sizes: rows for its share (of ``engines``) of the in-flight agents of the groups in
    flight, a KV pool of at most ``kv_fraction`` of device memory. ``backend`` and ``bytes_limit`` (the device
    allocator's limit) default to the running backend's; the deviceless compile passes its target's.

    ``evaluation=True`` sizes ``sera-eval``'s engine instead: rows for ``eval.concurrency`` trees and their
    sub-agents, ``eval.context_tokens`` of context. ``model_cfg`` is the served model's (a checkpoint's or a HF
    directory's may differ from ``cfg``'s); default ``cfg.model_config()``."""
    if evaluation:
        context = cfg.eval.context_tokens
        agents = 2 * cfg.eval.concurrency          # each tree's root and a sub-agent at a time
    else:
        r = cfg.rollout
        context = r.context_tokens
        agents = -(-groups_in_flight(cfg) // engines) * r.trees_per_task * 2
    rows = min(256, 1 << max(3, (agents - 1).bit_length()))
    block = 16
    blocks_per_seq = -(-context // block)
    # The pool holds what fits in a share of device memory (paged: rows share it; a request waits when it is full).
    m = model_cfg if model_cfg is not None else cfg.model_config()
    bytes_per_block = 2 * m.num_layers * m.num_kv_heads * m.head_dim * block * (2 if model_dtype == "bfloat16" else 4)
    budget = kv_cache_budget_bytes(kv_fraction, bytes_limit)
    num_blocks = max(blocks_per_seq + 1, min(1 + rows * blocks_per_seq, budget // bytes_per_block))
    shapes = (cpu_shapes(rows, context, block) if (backend or jax.default_backend()) == "cpu"
              else dict(max_prefill_len=min(2048, context)))
    return EngineConfig(max_batch=rows, block_size=block, num_blocks=int(num_blocks),
                        max_context=context, dtype=model_dtype, **shapes)


def kv_cache_budget_bytes(fraction: float = 0.35, bytes_limit: int | None = None) -> int:
    """Returns the bytes the KV pool may take: a fraction of ``bytes_limit``, by default the first local device's
    memory limit (GPU), or 2 GiB where the backend reports none (CPU)."""
    if bytes_limit is not None:
        return int(bytes_limit * fraction)
    try:
        stats = jax.local_devices()[0].memory_stats() or {}
    except Exception:  # noqa: BLE001 - backends without memory stats
        stats = {}
    limit = stats.get("bytes_limit")
    return int(limit * fraction) if limit else 2 << 30
