"""``sera-serve``'s parts: the engine sized for serving, and uvicorn running the app on it."""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import jax

from sera_jax.assembly.engines import KV_FRACTION, kv_cache_budget_bytes
from sera_jax.sampling import Engine, EngineConfig
from sera_jax.sampling.engine_config import cpu_shapes
from sera_jax.serving.app import create_app
from sera_jax.serving.openai_requests import Limits
from sera_jax.serving.policy import ServedPolicy

DEFAULT_CONTEXT = 4096


@dataclasses.dataclass(frozen=True)
class ServeOptions:
    """Engine size and request limits of a server (``sera-serve`` flags)."""

    max_batch: int = 32
    max_context: int | None = None     # None: the model's positions, at most DEFAULT_CONTEXT
    num_blocks: int | None = None      # None: every row's full context, within the KV share of device memory
    dtype: str | None = None           # None: float32 on CPU, bfloat16 on GPU
    max_tokens: int | None = None      # None: the context
    max_n: int = 8
    max_body_bytes: int = 4 << 20
    deadline_s: float = 600.0
    warmup: bool = False
    max_top_logprobs: int = 5          # most likely tokens computed beside each generated one (0: none)


def engine_config(model_cfg: Any, opts: ServeOptions, backend: str | None = None) -> EngineConfig:
    """Returns the serving engine's sizes: ``max_batch`` rows, ``max_context`` tokens per request, and a KV pool
    that holds every row's whole context when device memory allows (a request waits for blocks otherwise)."""
    backend = backend or jax.default_backend()
    ctx = opts.max_context or min(model_cfg.max_position_embeddings, DEFAULT_CONTEXT)
    dtype = opts.dtype or ("float32" if backend == "cpu" else "bfloat16")
    block = 16
    per_seq = math.ceil(ctx / block)
    if opts.num_blocks is None:
        width = 2 if dtype == "float32" else 1
        per_block = 2 * model_cfg.num_layers * model_cfg.num_kv_heads * model_cfg.head_dim * block * 2 * width
        num_blocks = max(per_seq + 1, min(1 + opts.max_batch * per_seq, kv_cache_budget_bytes(KV_FRACTION) // per_block))
    else:
        num_blocks = opts.num_blocks
    shapes = cpu_shapes(opts.max_batch, ctx, block) if backend == "cpu" else dict(max_prefill_len=min(2048, ctx))
    return EngineConfig(max_batch=opts.max_batch, block_size=block, num_blocks=int(num_blocks), max_context=ctx,
                        dtype=dtype, top_logprobs=opts.max_top_logprobs, **shapes)


def limits(config: EngineConfig, opts: ServeOptions) -> Limits:
    """Returns the request limits of a server whose engine has ``config``."""
    return Limits(max_context=config.max_context, max_tokens=min(opts.max_tokens or config.max_context,
                                                                   config.max_context - 1),
                  max_n=opts.max_n, max_body_bytes=opts.max_body_bytes, deadline_s=opts.deadline_s,
                  max_top_logprobs=config.top_logprobs)


def build_app(policy: ServedPolicy, opts: ServeOptions) -> tuple[Any, Engine]:
    """Returns (the app, its engine) for ``policy``; the engine compiles every shape first when ``opts.warmup``."""
    config = engine_config(policy.model_cfg, opts)
    engine = Engine(policy.model_cfg, policy.params, config, tokenizer=policy.tokenizer)
    if opts.warmup:
        engine.warmup()
    return create_app(engine, policy.tokenizer, policy.name, limits(config, opts), source=policy.source), engine


def serve(policy: ServedPolicy, opts: ServeOptions, host: str, port: int, *, graceful_s: float = 30.0,
          log_level: str = "info", on_listen: Any = None) -> None:
    """Serves ``policy`` until interrupted. The socket is bound first (``port`` 0: any free one) and
    ``on_listen(url)`` is called with its address. On SIGINT/SIGTERM uvicorn stops accepting, waits up to
    ``graceful_s`` for the requests in flight, then the engine closes."""
    import socket

    import uvicorn

    app, _ = build_app(policy, opts)
    sock = socket.create_server((host, port), family=socket.AF_INET6 if ":" in host else socket.AF_INET,
                                reuse_port=False)
    bound = sock.getsockname()[1]
    if on_listen is not None:
        on_listen(f"http://{host}:{bound}")
    config = uvicorn.Config(app, log_level=log_level, timeout_graceful_shutdown=graceful_s, access_log=False)
    uvicorn.Server(config).run(sockets=[sock])
