"""The device side of rollouts: a continuous-batching engine over a paged KV cache with prefix caching.

``Engine(cfg, params, EngineConfig(...), mesh=..., tokenizer=...)``; ``await engine.generate(prompt_ids,
SamplingParams(...), key=...) -> GenerationResult``; ``engine.load_weights(params) -> version``.
"""

from sera_jax.sampling.attention import paged_attention
from sera_jax.sampling.block_manager import BlockManager, chain_digests
from sera_jax.sampling.engine import Engine, EngineError
from sera_jax.sampling.engine_config import EngineConfig
from sera_jax.sampling.sample import sample_tokens
from sera_jax.sampling.types import GenerationResult, Generator, SamplingParams

__all__ = ["BlockManager", "Engine", "EngineConfig", "EngineError", "GenerationResult", "Generator",
           "SamplingParams", "chain_digests", "paged_attention", "sample_tokens"]
