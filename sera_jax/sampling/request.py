"""One turn inside the engine: its validated inputs, its host-side progress, and how it ends.

``make_request`` checks everything a caller can get wrong and raises ``ValueError``/``TypeError`` in the caller's
own coroutine, so a bad request never reaches (or crashes) the driver.
"""

from __future__ import annotations

import asyncio
import dataclasses
import math
from typing import Any, Sequence

import numpy as np

from sera_jax.sampling.types import GenerationResult, SamplingParams


@dataclasses.dataclass(eq=False)
class Request:
    """A turn's state on the host. Identity (not value) equality: it is a handle."""

    rid: int
    prompt: list[int]
    params: SamplingParams
    key_data: np.ndarray  # uint32[2] raw key data; token i is sampled with fold_in(key, i)
    max_new: int  # params.max_new_tokens, capped by the context
    stop_ids: np.ndarray  # int32[max_stop_ids], -1 padded
    future: asyncio.Future | None = None
    loop: asyncio.AbstractEventLoop | None = None
    # Called on the request's loop with (token ids, logprobs[, top logprobs]) so far whenever a round adds tokens to
    # a live turn (a server's stream); the finished turn still comes back through ``future``.
    on_progress: Any = None
    reported: int = 0  # tokens already handed to ``on_progress``
    # --- host progress ---
    slot: int = -1
    blocks: list[int] = dataclasses.field(default_factory=list)
    prompt_digests: list[bytes] = dataclasses.field(default_factory=list)
    cached_tokens: int = 0  # prompt tokens reused from the prefix cache
    prefilled: int = 0  # prompt tokens whose K/V are computed or dispatched (cached ones included)
    decoding: bool = False  # first token sampled (dispatched); the row takes part in decode chunks
    ub_len: int = 0  # upper bound of the row's K/V length after everything dispatched
    tokens: list[int] = dataclasses.field(default_factory=list)
    logprobs: list[float] = dataclasses.field(default_factory=list)
    top_logprobs: list[tuple[tuple[int, float], ...]] = dataclasses.field(default_factory=list)  # when asked for
    text_checked: int = 0  # generated tokens already searched for stop strings
    version: int = 0
    finished: bool = False
    cancelled: bool = False

    def result(self, reason: str) -> GenerationResult:
        """Returns the turn's ``GenerationResult`` with ``finish_reason = reason``."""
        return GenerationResult(token_ids=tuple(self.tokens), logprobs=tuple(self.logprobs),
                                policy_version=self.version, finish_reason=reason, prompt_len=len(self.prompt),
                                cached_prompt_tokens=self.cached_tokens, top_logprobs=tuple(self.top_logprobs))


def key_data_of(key: Any, fallback: tuple[int, int]) -> np.ndarray:
    """Returns raw uint32[2] threefry key data of ``key`` (a typed key or raw data), or ``fallback`` if None."""
    if key is None:
        return np.asarray(fallback, dtype=np.uint32)
    words = getattr(key, "host_words", None)  # a key that carries its words (agents.keys): no device op
    if words is not None:
        return np.asarray(words, dtype=np.uint32)
    import jax

    if hasattr(key, "dtype") and jax.dtypes.issubdtype(key.dtype, jax.dtypes.prng_key):
        key = jax.random.key_data(key)
    arr = np.asarray(key)
    if arr.shape != (2,) or not np.issubdtype(arr.dtype, np.integer):
        raise ValueError(f"key must be a single jax.random key (or uint32[2] key data), got shape {arr.shape} "
                         f"dtype {arr.dtype}")
    return arr.astype(np.uint32)


def make_request(rid: int, prompt_ids: Sequence[int], params: SamplingParams, key: Any, *, vocab_size: int,
                 max_context: int, max_stop_ids: int, block_size: int, capacity_blocks: int,
                 has_tokenizer: bool, fallback_key: tuple[int, int], max_top_logprobs: int = 0) -> Request:
    """Returns a validated ``Request``; raises ValueError/TypeError saying what is wrong with the request."""
    if not isinstance(params, SamplingParams):
        raise TypeError(f"params must be a SamplingParams, got {type(params).__name__}")
    try:
        prompt = np.asarray(list(prompt_ids))
    except TypeError as e:
        raise TypeError(f"prompt_ids must be a sequence of token ids: {e}") from None
    if prompt.size == 0:
        raise ValueError("empty prompt: the engine needs at least one prompt token to condition on")
    if prompt.ndim != 1 or not np.issubdtype(prompt.dtype, np.integer):
        raise ValueError(f"prompt_ids must be a flat sequence of ints, got dtype {prompt.dtype} shape {prompt.shape}")
    if prompt.min() < 0 or prompt.max() >= vocab_size:
        raise ValueError(f"prompt token ids must lie in [0, {vocab_size}), got min {prompt.min()} max {prompt.max()}")
    if len(prompt) >= max_context:
        raise ValueError(f"prompt of {len(prompt)} tokens leaves no room in the engine's context of {max_context} "
                         "tokens (truncate the prompt, docs/design/algorithm.md §1.3)")
    if not (math.isfinite(params.temperature) and math.isfinite(params.top_p)):
        raise ValueError(f"temperature and top_p must be finite, got {params.temperature}, {params.top_p}")
    if params.top_logprobs > max_top_logprobs:
        raise ValueError(f"top_logprobs={params.top_logprobs} exceeds the {max_top_logprobs} this engine computes "
                         "(EngineConfig.top_logprobs)")
    if len(params.stop_ids) > max_stop_ids:
        raise ValueError(f"at most {max_stop_ids} stop ids per request (EngineConfig.max_stop_ids), got "
                         f"{len(params.stop_ids)}")
    if any((not isinstance(s, (int, np.integer))) or not 0 <= s < vocab_size for s in params.stop_ids):
        raise ValueError(f"stop ids must be ints in [0, {vocab_size}), got {params.stop_ids}")
    if params.stop_strings:
        if not has_tokenizer:
            raise ValueError("stop_strings need a tokenizer: construct the Engine with tokenizer=...")
        if any(not isinstance(s, str) or not s for s in params.stop_strings):
            raise ValueError(f"stop strings must be non-empty str, got {params.stop_strings}")
    max_new = min(int(params.max_new_tokens), max_context - len(prompt))
    need = math.ceil((len(prompt) + max_new - 1) / block_size)
    if need > capacity_blocks:
        raise ValueError(f"request needs {need} KV blocks but the whole pool has {capacity_blocks}: it could never "
                         "be admitted (lower max_new_tokens or enlarge EngineConfig.num_blocks)")
    stop = np.full((max_stop_ids,), -1, np.int32)
    stop[: len(params.stop_ids)] = params.stop_ids
    return Request(rid=rid, prompt=[int(t) for t in prompt], params=params,
                   key_data=key_data_of(key, fallback_key), max_new=max_new, stop_ids=stop)


def find_stop_string(decode, tokens: Sequence[int], stops: Sequence[str], checked: int) -> int | None:
    """Returns the smallest n such that decode(tokens[:n]) contains a stop string, or None.

    ``tokens[:checked]`` were searched before, so only matches ending after them are looked for. A match of an
    m-character string covers at most m tokens (every token of it contributes a character), so decoding the tail
    from ``checked - m`` suffices: the cost per chunk does not grow with the length of the turn.
    """
    start = max(0, checked - max(len(s) for s in stops))
    tail = tokens[start:]
    if not any(s in decode(tail) for s in stops):
        return None
    for n in range(max(start + 1, checked), len(tokens) + 1):
        if any(s in decode(tokens[start:n]) for s in stops):
            return n
    return len(tokens)
