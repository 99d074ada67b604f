"""A scripted policy: a Generator test double that replays canned replies through the real runtime.

Replies are looked up by the agent that is generating (``harness.CURRENT_TURN``: tree id, node id, turn index) in a
``{node_id: [reply, …]}`` dict, or produced by a callable ``script(info, prompt_ids) -> str``. Each reply is
tokenised with a real tokenizer and shaped the way the engine shapes a completion: cut right after the token that
completes a stop string (``</python>``), else ended with ``<|im_end|>`` (a stop id, included), and cut at
``max_new_tokens`` (finish reason ``length``). Logprobs are a deterministic function of the turn key, the position
and the token, so a change of key changes them (records then differ). ``calls`` keeps (start, end, TurnInfo,
prompt length) of every call, and ``latency_s`` simulates device time without blocking the event loop.

``script_emission`` turns the same script into what a simulated engine emits (``sampling.simulated_engine``): the
reply's tokens then ``<|im_end|>``, with the same logprobs, left to the engine's own stop handling to cut; a run on
the simulated device then records the trees this generator would.
"""

from __future__ import annotations

import asyncio
import hashlib
import time
from typing import Any, Callable, Mapping, Sequence

import jax
import numpy as np

from sera_jax.agents.harness import CURRENT_TURN, TurnInfo
from sera_jax.sampling.types import GenerationResult, SamplingParams

Script = Mapping[str, Sequence[str]] | Callable[[TurnInfo, Sequence[int]], str]


class ScriptedGenerator:
    """Implements ``sampling.types.Generator`` from a script (see the module docstring)."""

    def __init__(self, tokenizer: Any, script: Script, *, policy_version: int = 0, latency_s: float = 0.0,
                 default: str = ""):
        self.tokenizer, self.script, self.policy_version = tokenizer, script, policy_version
        self.latency_s, self.default = latency_s, default
        self.calls: list[tuple[float, float, TurnInfo | None, int]] = []

    def reply_for(self, info: TurnInfo | None, prompt_ids: Sequence[int]) -> str:
        """Returns the scripted reply text of one turn (``default`` when the script has none)."""
        if callable(self.script):
            return self.script(info, prompt_ids)
        replies = self.script.get(info.node_id, ()) if info is not None else ()
        return replies[info.turn] if info is not None and info.turn < len(replies) else self.default

    async def generate(self, prompt_ids: Sequence[int], params: SamplingParams,
                       key: jax.Array | None = None) -> GenerationResult:
        """Returns the scripted completion of the calling agent's turn, shaped like an engine result."""
        t0 = time.monotonic()
        info = CURRENT_TURN.get()
        text = self.reply_for(info, prompt_ids)
        tok = self.tokenizer
        ids = list(tok.encode(text))
        reason = None
        for k in range(1, len(ids) + 1):  # the engine stops at the token that completes a stop string
            if any(s in tok.decode(ids[:k]) for s in params.stop_strings):
                ids, reason = ids[:k], "stop_string"
                break
        if reason is None:
            for k, t in enumerate(ids):
                if t in params.stop_ids:
                    ids, reason = ids[:k + 1], "stop_id"
                    break
        if reason is None:
            ids, reason = ids + [tok.im_end_id], "stop_id"
        if len(ids) > params.max_new_tokens:
            ids, reason = ids[:params.max_new_tokens], "length"
        seed = _key_seed(key)
        logprobs = tuple(_fake_logprob(seed, i, t) for i, t in enumerate(ids))
        if self.latency_s:
            await asyncio.sleep(self.latency_s)
        self.calls.append((t0, time.monotonic(), info, len(prompt_ids)))
        return GenerationResult(tuple(ids), logprobs, self.policy_version, reason, len(prompt_ids))


def script_emission(tokenizer: Any, script: Script, default: str = ""):
    """Returns ``emission(prompt_ids, params, key) -> (token ids, logprobs)`` of ``script`` for a simulated engine:
    the calling agent's reply (read from ``harness.CURRENT_TURN`` on the caller's context, as ``ScriptedGenerator``
    reads it), tokenised, then ``<|im_end|>``; logprobs as ``ScriptedGenerator`` gives them."""
    reader = ScriptedGenerator(tokenizer, script, default=default)

    def emission(prompt_ids: Sequence[int], params: SamplingParams, key: jax.Array | None):
        ids = list(tokenizer.encode(reader.reply_for(CURRENT_TURN.get(), prompt_ids))) + [tokenizer.im_end_id]
        seed = _key_seed(key)
        return ids, [_fake_logprob(seed, i, t) for i, t in enumerate(ids)]

    return emission


def _key_seed(key: jax.Array | None) -> str:
    if key is None:
        return ""
    words = getattr(key, "host_words", None)  # agents.keys' keys carry their words
    return ",".join(str(int(x)) for x in (words if words is not None else jax.random.key_data(key).ravel()))


def _fake_logprob(seed: str, position: int, token: int) -> float:
    h = hashlib.blake2b(f"{seed}|{position}|{token}".encode(), digest_size=4).digest()
    # Rounded to float32, as an engine's logprobs are (a simulated engine emits these).
    return float(np.float32(-(int.from_bytes(h, "little") % 100000) / 10000.0 - 1e-4))
