"""The sampling engines a run builds: how many per host, each one's rows, its KV pool within a share of device
memory, and whether they run on this host's devices or on a simulated device (``engine.backend``)."""

from __future__ import annotations

import functools
from typing import Any, Callable, Sequence

import jax

from sera_jax.assembly.concurrency import groups_in_flight
from sera_jax.config import ConfigError, RunConfig
from sera_jax.sampling import EngineConfig
from sera_jax.sampling.engine import Engine
from sera_jax.sampling.engine_config import cpu_shapes
from sera_jax.sampling.simulated_engine import SimulatedEngine
from sera_jax.sampling.simulation import Simulation, installed

KV_FRACTION = 0.35         # of each device's memory for the policy engines' KV pools
JUDGE_KV_FRACTION = 0.05   # of the first device's, taken from the above, for a policy_frozen judge's engine


def num_engines(cfg: RunConfig, local_devices: Sequence[Any]) -> int:
    """Returns how many sampling engines this host runs (``rollout.engines``; null = every local GPU, 1 on CPU,
    where fake devices share the same cores). Raises ConfigError when the host has fewer devices."""
    n = cfg.rollout.engines
    if cfg.engine.backend == "simulated":
        return cfg.engine.simulated_gpus if n is None else n   # simulated GPUs need no local device
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


def simulation(cfg: RunConfig) -> Simulation | None:
    """Returns the simulated device the run's engines use (``engine.backend: simulated``), None for real devices.
    Raises ConfigError when the process has none installed or one of another GPU than ``engine.simulate``."""
    if cfg.engine.backend != "simulated":
        return None
    sim = installed()
    if sim is None:
        raise ConfigError("engine.backend: simulated needs a simulated device in this process: run the command with "
                          f"--simulate {cfg.engine.simulate} (sera-train, sera-eval, sera-profile)")
    if sim.target != cfg.engine.simulate:
        raise ConfigError(f"engine.simulate: {cfg.engine.simulate!r}, but this process simulates {sim.target!r}")
    return sim


def engine_maker(cfg: RunConfig, tokenizer: Any, model_cfg: Any = None) -> Callable[..., Engine]:
    """Returns what builds one of the run's engines, with ``Engine``'s signature: ``Engine`` itself, or on a
    simulated device a ``SimulatedEngine`` timed for ``model_cfg`` (default the run's) in bf16 and emitting the
    installed simulation's script for this run."""
    sim = simulation(cfg)
    if sim is None:
        return Engine
    timer = sim.timer(model_cfg if model_cfg is not None else cfg.model_config(), 2)
    return functools.partial(SimulatedEngine, timer=timer, emission=sim.script(cfg, tokenizer))


def simulated_engine_config(cfg: RunConfig, engines: int, *, evaluation: bool = False,
                            model_cfg: Any = None) -> EngineConfig:
    """Returns ``engine_config`` for engines on the simulated GPU: bf16, its shapes and its memory."""
    sim = simulation(cfg)
    return engine_config(cfg, "bfloat16", engines, backend="gpu", bytes_limit=sim.bytes_limit,
                         evaluation=evaluation, model_cfg=model_cfg)
