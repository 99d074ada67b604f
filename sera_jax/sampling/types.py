"""The engine's request/response records: what the agent runtime sends and what it gets back for one turn."""

from __future__ import annotations

import dataclasses
from typing import Any, Mapping, Protocol, Sequence

import jax


@dataclasses.dataclass(frozen=True)
class SamplingParams:
    """How to sample one turn. ``temperature`` 0 means greedy; ``top_p`` 1.0 means no nucleus cut.

    ``stop_ids`` end the turn when generated (included in the output); ``stop_strings`` end it once the decoded
    completion contains one (output cut right after the token that completes it, which is included).
    ``top_logprobs`` > 0 asks for that many most likely tokens at each position (at most the engine's
    ``EngineConfig.top_logprobs``).
    """

    max_new_tokens: int = 512
    temperature: float = 1.0
    top_p: float = 1.0
    stop_ids: tuple[int, ...] = ()
    stop_strings: tuple[str, ...] = ()
    top_logprobs: int = 0

    def __post_init__(self) -> None:
        if self.max_new_tokens <= 0:
            raise ValueError(f"max_new_tokens must be positive, got {self.max_new_tokens}")
        if self.temperature < 0:
            raise ValueError(f"temperature must be ≥ 0, got {self.temperature}")
        if not 0.0 < self.top_p <= 1.0:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")
        if self.top_logprobs < 0:
            raise ValueError(f"top_logprobs must be ≥ 0, got {self.top_logprobs}")


@dataclasses.dataclass(frozen=True)
class GenerationResult:
    """One finished turn.

    ``logprobs[i]`` is log p(token_ids[i]) under the policy at temperature 1 (CISPO's behaviour logprob), whatever
    temperature sampled it. ``top_logprobs[i]`` (when the params asked for k > 0) holds the k most likely
    (token id, logprob) pairs at position i under the same distribution, most likely first.
    ``finish_reason`` is ``stop_id`` | ``stop_string`` | ``length`` | ``cancelled``.
    ``prefill_tokens`` counts prompt tokens actually computed (the rest came from the prefix cache).
    ``usage`` is a served model's own token counts (``prompt_tokens``, ``completion_tokens``, the route and replica
    asked; ``sampling/endpoint.py``), None for the engine, whose ids are the count.
    """

    token_ids: tuple[int, ...]
    logprobs: tuple[float, ...]
    policy_version: int
    finish_reason: str
    prompt_len: int
    cached_prompt_tokens: int = 0
    top_logprobs: tuple[tuple[tuple[int, float], ...], ...] = ()
    usage: Mapping[str, Any] | None = None


class Generator(Protocol):
    """The policy interface: what the agent runtime awaits for every turn and side call. Implementations: the
    engine (``sampling/engine.py``), a served model (``sampling/endpoint.py``), and scripted test doubles."""

    async def generate(self, prompt_ids: Sequence[int], params: SamplingParams,
                       key: jax.Array | None = None) -> GenerationResult: ...
