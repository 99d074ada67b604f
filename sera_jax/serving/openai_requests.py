"""OpenAI request bodies → what to generate: every field a client can get wrong is checked here, and a bad one is an
``APIError`` (400/404/413) naming it, raised before anything reaches the engine.

Supported: ``/v1/chat/completions`` (``messages``, ``max_tokens``/``max_completion_tokens``, ``temperature``,
``top_p``, ``stop``, ``n``, ``seed``, ``logprobs``, ``stream``, ``stream_options.include_usage``) and
``/v1/completions`` (``prompt`` as text, token ids, or a list of either). ``top_logprobs`` (completions:
``logprobs`` = k) up to the k the engine computes beside each token (``sera-serve --max-top-logprobs``). ``ignore_eos`` (vLLM's extension) decodes past the end-of-turn
tokens, to ``max_tokens`` or a stop string: fixed-length load for benchmarks. Unknown fields are ignored,
as OpenAI-compatible servers do (the judge's ``chat_template_kwargs``, ``reasoning_effort``: our chat template has no
thinking mode).
"""

from __future__ import annotations

import dataclasses
import json
from typing import Any

import numpy as np

from sera_jax.serving.errors import APIError, bad_request

MAX_STOP_STRINGS = 4
_U32 = 0xFFFFFFFF


@dataclasses.dataclass(frozen=True)
class Limits:
    """What the server accepts: context (prompt + completion), completion tokens, choices, body size, deadline."""

    max_context: int
    max_tokens: int
    max_n: int = 8
    max_body_bytes: int = 4 << 20
    deadline_s: float = 600.0
    max_top_logprobs: int = 0


@dataclasses.dataclass(frozen=True)
class Plan:
    """What one request asks for: prompts (token ids), completions per prompt, sampling, and response options."""

    prompts: tuple[tuple[int, ...], ...]
    n: int
    max_tokens: tuple[int, ...]     # per prompt (the default fills the context)
    temperature: float
    top_p: float
    stop: tuple[str, ...]
    seed: int | None
    logprobs: bool
    stream: bool
    include_usage: bool
    ignore_eos: bool = False
    top_logprobs: int = 0            # most likely tokens reported beside each one (with logprobs)

    def key_data(self, index: int) -> np.ndarray | None:
        """Returns raw uint32[2] key data for choice ``index`` when a seed was given (a reproducible draw), else
        None (the engine picks a fresh key)."""
        if self.seed is None:
            return None
        s = self.seed & ((1 << 64) - 1)
        return np.asarray([s & _U32, ((s >> 32) + 0x9E3779B1 * index) & _U32], np.uint32)


def parse_json_body(raw: bytes, limit: int) -> dict:
    """Returns the request's JSON object; raises 413 over ``limit`` bytes, 400 for invalid UTF-8, malformed JSON or
    a body that is not an object."""
    if len(raw) > limit:
        raise APIError(413, f"request body of {len(raw)} bytes exceeds the server's limit of {limit} bytes",
                       code="body_too_large")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise bad_request(f"request body is not valid UTF-8: {e}", code="invalid_utf8") from None
    try:
        body = json.loads(text)
    except ValueError as e:
        raise bad_request(f"request body is not valid JSON: {e}", code="invalid_json") from None
    if not isinstance(body, dict):
        raise bad_request("request body must be a JSON object", code="invalid_json")
    return body


def _is_int(x: Any) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def _number(body: dict, name: str, default: float, lo: float, hi: float, lo_open: bool = False) -> float:
    x = body.get(name)
    if x is None:
        return default
    if not isinstance(x, (int, float)) or isinstance(x, bool) or x != x:
        raise bad_request(f"{name} must be a number, got {x!r}", name)
    if x < lo or x > hi or (lo_open and x == lo):
        bound = f"({lo}, {hi}]" if lo_open else f"[{lo}, {hi}]"
        raise bad_request(f"{name} must be in {bound}, got {x}", name)
    return float(x)


def check_model(body: dict, served: str) -> None:
    """Raises 400 when ``model`` is missing or not a string, 404 when it is not the served model."""
    model = body.get("model")
    if not isinstance(model, str) or not model:
        raise bad_request("model is required (a string)", "model")
    if model != served:
        raise APIError(404, f"The model {model!r} does not exist; this server serves {served!r}", param="model",
                       code="model_not_found")


def chat_messages(body: dict) -> list[dict[str, str]]:
    """Returns ``messages`` as (role, str content) dicts; text content parts are joined. Raises 400 when missing
    or malformed."""
    msgs = body.get("messages")
    if not isinstance(msgs, list) or not msgs:
        raise bad_request("messages is required: a non-empty list of {role, content}", "messages")
    out = []
    for k, m in enumerate(msgs):
        if not isinstance(m, dict):
            raise bad_request(f"messages[{k}] must be an object", "messages")
        role, content = m.get("role"), m.get("content")
        if role not in ("system", "user", "assistant"):
            raise bad_request(f"messages[{k}].role must be system, user or assistant, got {role!r}", "messages")
        if isinstance(content, list):
            if not all(isinstance(p, dict) and p.get("type") == "text" and isinstance(p.get("text"), str)
                       for p in content):
                raise bad_request(f"messages[{k}].content: only text parts are supported", "messages")
            content = "".join(p["text"] for p in content)
        if not isinstance(content, str):
            raise bad_request(f"messages[{k}].content must be a string", "messages")
        out.append({"role": role, "content": content})
    return out


def completion_prompts(body: dict, tokenizer: Any, vocab_size: int) -> list[list[int]]:
    """Returns the token ids of ``prompt`` (a string, a list of token ids, or a list of either); raises 400."""
    p = body.get("prompt")
    if isinstance(p, str) or (isinstance(p, list) and p and all(_is_int(t) for t in p)):
        p = [p]
    if not isinstance(p, list) or not p:
        raise bad_request("prompt is required: a string, a list of token ids, or a non-empty list of either",
                          "prompt")
    out = []
    for item in p:
        if isinstance(item, str):
            ids = tokenizer.encode(item)
        elif isinstance(item, list) and item and all(_is_int(t) for t in item):
            if any(not 0 <= t < vocab_size for t in item):
                raise bad_request(f"prompt token ids must lie in [0, {vocab_size})", "prompt")
            ids = list(item)
        else:
            raise bad_request("each prompt must be a string or a non-empty list of token ids", "prompt")
        if not ids:
            raise bad_request("a prompt encodes to no tokens", "prompt")
        out.append(ids)
    return out


def make_plan(body: dict, prompts: list[list[int]], limits: Limits, *, chat: bool) -> Plan:
    """Returns the Plan of a request whose prompts are encoded; raises 400 for any sampling field out of range,
    a prompt over the context, or a completion that does not fit in it."""
    n = body.get("n", 1) if body.get("n") is not None else 1
    if not _is_int(n) or not 1 <= n <= limits.max_n:
        raise bad_request(f"n must be an integer in [1, {limits.max_n}], got {n!r}", "n")
    temperature = _number(body, "temperature", 1.0, 0.0, 2.0)
    top_p = _number(body, "top_p", 1.0, 0.0, 1.0, lo_open=True)
    stop = body.get("stop")
    stop = () if stop is None else (stop,) if isinstance(stop, str) else stop
    if (not isinstance(stop, (list, tuple)) or len(stop) > MAX_STOP_STRINGS
            or not all(isinstance(s, str) and s for s in stop)):
        raise bad_request(f"stop must be a non-empty string or a list of at most {MAX_STOP_STRINGS} of them", "stop")
    seed = body.get("seed")
    if seed is not None and not _is_int(seed):
        raise bad_request(f"seed must be an integer, got {seed!r}", "seed")
    if chat:
        logprobs = body.get("logprobs") or False
        if not isinstance(logprobs, bool):
            raise bad_request("logprobs must be a boolean", "logprobs")
        top = _top_logprobs(body.get("top_logprobs"), "top_logprobs", limits)
        if top and not logprobs:
            raise bad_request("top_logprobs needs logprobs: true", "top_logprobs")
    else:
        lp = body.get("logprobs")
        top = _top_logprobs(lp, "logprobs", limits)
        logprobs = lp is not None
    stream = body.get("stream") or False
    if not isinstance(stream, bool):
        raise bad_request("stream must be a boolean", "stream")
    options = body.get("stream_options") or {}
    if not isinstance(options, dict):
        raise bad_request("stream_options must be an object", "stream_options")
    name = "max_completion_tokens" if chat and body.get("max_completion_tokens") is not None else "max_tokens"
    asked = body.get(name)
    if asked is not None and (not _is_int(asked) or not 1 <= asked <= limits.max_tokens):
        raise bad_request(f"{name} must be an integer in [1, {limits.max_tokens}], got {asked!r}", name)
    caps = []
    for ids in prompts:
        if len(ids) >= limits.max_context:
            raise bad_request(f"This model's maximum context length is {limits.max_context} tokens; the prompt has "
                              f"{len(ids)} tokens", "messages" if chat else "prompt", "context_length_exceeded")
        room = limits.max_context - len(ids)
        if asked is not None and asked > room:
            raise bad_request(f"This model's maximum context length is {limits.max_context} tokens; you requested "
                              f"{len(ids) + asked} ({len(ids)} in the prompt, {asked} for the completion)", name,
                              "context_length_exceeded")
        caps.append(min(room, limits.max_tokens) if asked is None else asked)
    ignore_eos = body.get("ignore_eos") or False
    if not isinstance(ignore_eos, bool):
        raise bad_request("ignore_eos must be a boolean", "ignore_eos")
    return Plan(tuple(tuple(p) for p in prompts), n, tuple(caps), temperature, top_p, tuple(stop), seed, logprobs,
                stream, bool(options.get("include_usage")), ignore_eos, top)


def _top_logprobs(value: Any, name: str, limits: Limits) -> int:
    """Returns the number of top logprobs asked for (null: 0); raises APIError beyond what the engine computes."""
    if value is None:
        return 0
    k = limits.max_top_logprobs
    if not _is_int(value) or not 0 <= value <= k:
        raise bad_request(f"{name} must be an integer in [0, {k}], got {value!r} (this server computes {k} most "
                          "likely tokens beside each one: sera-serve --max-top-logprobs)", name)
    return int(value)
