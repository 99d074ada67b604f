"""A policy behind an OpenAI-compatible endpoint: the second implementation of the generator interface
(``sampling.types.Generator``; the first is the engine), so that an agent turn, a rubric or scoring call and a judge
request can be played by a served model (``sera-serve``, vLLM, SGLang, an API model) as well as by our own engine.

The runtime hands every generator the same thing: the prompt's token ids, built and cut to the prompt budget with the
served model's tokenizer exactly as in process (``agents/truncation.py``). Here they become a request:

* a prompt that is whole ChatML (``<|im_start|>role\\n…<|im_end|>\\n`` messages ending with the assistant's generation
  prompt) goes out as **chat messages** to ``/chat/completions``: the environment's own prompts. The messages are read
  back from the ids at the ChatML token boundaries, so text that merely looks like a marker stays text;
* a prompt that is not (the head + tail cut of an overlong one) goes to ``/completions`` as its token ids, which
  the OpenAI API accepts: exactly the tokens the budget rule chose.

The turn's stop strings are sent as ``stop``. Servers leave the stop string out of the text (the OpenAI convention);
the one that matched is put back from ``stop_reason`` (vLLM, SGLang and ``sera-serve`` say which), so the completion
reads as the engine's would (``…</python>``). A reply that ended on the end-of-turn token gets that token back at the
end of its ids. The completion's ids are the served model's tokenizer's encoding of the text (a server does not
return them); its logprobs are NaN (unknown: nothing trains on an endpoint's tokens) and tokens are counted from the
response's ``usage``, carried on the result.

Requests per policy are bounded (``concurrency``); each is retried after back-off up to ``max_attempts`` times on
any failure (HTTP error, time-out, unreachable replica, a reply that is not a completion), the next attempt going to
the next replica. A turn that still fails raises ``EndpointError`` naming the endpoint and the cause: the runtime
records it as that agent's error, and the evaluation protocol retries and then counts the tree as errored.
"""

from __future__ import annotations

import asyncio
import copy
import dataclasses
import math
from typing import Any, Mapping, Sequence

from sera_jax.sampling.openai_client import OpenAIClient, usage_tokens
from sera_jax.sampling.types import GenerationResult, SamplingParams

MAX_STOP_STRINGS = 4  # the OpenAI API's limit on ``stop``


class EndpointError(RuntimeError):
    """An endpoint gave no usable completion after every attempt (the message names it and the last cause)."""


def chatml_messages(tokenizer: Any, prompt_ids: Sequence[int]) -> list[dict[str, str]] | None:
    """Returns the chat messages whose ChatML rendering (with the generation prompt) ``prompt_ids`` are, or None when
    they are not such a rendering: split at the ``<|im_start|>`` / ``<|im_end|>`` token ids, each message's role is
    its first line and its content the rest, decoded from its own tokens."""
    start, end = tokenizer.im_start_id, tokenizer.im_end_id
    ids = [int(t) for t in prompt_ids]
    messages: list[dict[str, str]] = []
    i, n = 0, len(ids)
    while i < n:
        if ids[i] != start:
            return None
        try:
            j = ids.index(end, i + 1)
        except ValueError:
            j = -1
        body = ids[i + 1:] if j < 0 else ids[i + 1:j]
        if start in body:
            return None
        text = tokenizer.decode(body)
        if j < 0:  # the generation prompt ends the prompt: "assistant\n" and nothing after it
            return messages if text == "assistant\n" and messages else None
        role, sep, content = text.partition("\n")
        if not sep or not role or role != role.strip():
            return None
        messages.append({"role": role, "content": content})
        k = j + 1
        while k < n and ids[k] != start:
            k += 1
        if tokenizer.decode(ids[j + 1:k]) != "\n":
            return None
        i = k
    return None  # no generation prompt at the end


@dataclasses.dataclass(frozen=True)
class EndpointSettings:
    """How the endpoint policy asks: concurrent requests, attempts per turn, back-off, extra request fields."""

    concurrency: int = 64
    max_attempts: int = 3
    backoff_s: float = 1.0
    extra_body: Mapping[str, Any] = dataclasses.field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.concurrency < 1 or self.max_attempts < 1 or self.backoff_s < 0:
            raise ValueError("endpoint concurrency and max_attempts must be ≥ 1 and backoff_s ≥ 0")


class EndpointPolicy:
    """A ``Generator`` whose turns a served model plays (see the module docstring)."""

    policy_version = 0  # nothing the trainer publishes: every token it returns is tagged version 0

    def __init__(self, client: OpenAIClient, model: str, tokenizer: Any, settings: EndpointSettings | None = None,
                 *, tokenizer_source: str = ""):
        self.client, self.model, self.tokenizer = client, model, tokenizer
        self.settings = settings or EndpointSettings()
        self.tokenizer_source = tokenizer_source or str(getattr(tokenizer, "path", ""))
        self._gate: asyncio.Semaphore | None = None
        self._gate_loop: asyncio.AbstractEventLoop | None = None
        self.requests = {"chat": 0, "completions": 0, "failed_attempts": 0, "failed_turns": 0}

    def describe(self) -> dict[str, Any]:
        """Returns who plays the turns, as trees and reports record it."""
        return {"kind": "endpoint", "endpoints": list(self.client.base_urls), "model": self.model,
                "tokenizer": self.tokenizer_source}

    def _semaphore(self) -> asyncio.Semaphore:
        loop = asyncio.get_running_loop()
        if self._gate is None or self._gate_loop is not loop:
            self._gate, self._gate_loop = asyncio.Semaphore(self.settings.concurrency), loop
        return self._gate

    def request_body(self, prompt_ids: Sequence[int], params: SamplingParams) -> tuple[str, dict[str, Any]]:
        """Returns (route, JSON body) of the request for one turn."""
        body: dict[str, Any] = {**copy.deepcopy(dict(self.settings.extra_body)), "model": self.model,
                                "max_tokens": int(params.max_new_tokens), "temperature": float(params.temperature),
                                "top_p": float(params.top_p)}
        stops = [s for s in params.stop_strings if s][:MAX_STOP_STRINGS]
        if stops:
            body["stop"] = stops
        messages = chatml_messages(self.tokenizer, prompt_ids)
        if messages is not None:
            return "chat/completions", {**body, "messages": messages}
        return "completions", {**body, "prompt": [int(t) for t in prompt_ids]}

    async def generate(self, prompt_ids: Sequence[int], params: SamplingParams, key: Any = None) -> GenerationResult:
        """Returns the served model's completion of one turn as a GenerationResult (``usage`` from the server);
        raises EndpointError when every attempt failed."""
        route, body = self.request_body(prompt_ids, params)
        last = ""
        async with self._semaphore():
            for attempt in range(1, self.settings.max_attempts + 1):
                payload, err, url = await self.client.attempt(route, body)
                if payload is not None:
                    try:
                        result = self._result(payload, route, params, len(prompt_ids), url)
                        self.requests["chat" if route.startswith("chat") else "completions"] += 1
                        return result
                    except (KeyError, IndexError, TypeError, ValueError) as e:
                        err = f"malformed completion from {url}/{route}: {type(e).__name__}: {e}"
                last = err
                self.requests["failed_attempts"] += 1
                if attempt < self.settings.max_attempts:
                    await asyncio.sleep(self.settings.backoff_s * 2 ** (attempt - 1))
        self.requests["failed_turns"] += 1
        raise EndpointError(f"endpoint gave no completion after {self.settings.max_attempts} attempts: {last}")

    def _result(self, payload: dict, route: str, params: SamplingParams, prompt_len: int,
                url: str) -> GenerationResult:
        choice = payload["choices"][0]
        text = choice["message"]["content"] if route.startswith("chat") else choice["text"]
        if text is None:
            text = ""
        if not isinstance(text, str):
            raise TypeError("the completion's text is not a string")
        reason = choice.get("finish_reason")
        if reason not in ("stop", "length", "eos", None):
            raise ValueError(f"unknown finish_reason {reason!r}")
        stop = choice.get("stop_reason")
        stops = [s for s in params.stop_strings if s]
        matched = next((s for s in stops if text.endswith(s)), None)  # a server that kept the stop string
        if matched is None and isinstance(stop, str) and stop in stops:
            text, matched = text + stop, stop
        ids = self.tokenizer.encode(text)
        if matched is not None:
            finish = "stop_string"
        elif reason == "length":
            finish = "length"
        else:
            finish = "stop_id"
            ids = ids + [int(self.tokenizer.im_end_id)]  # the end of turn the engine's ids would hold
        usage = usage_tokens(payload)
        return GenerationResult(token_ids=tuple(ids), logprobs=(math.nan,) * len(ids), policy_version=0,
                                finish_reason=finish, prompt_len=prompt_len,
                                usage={**(usage or {}), "route": route, "url": url, "metered": usage is not None})

    async def aclose(self) -> None:
        """Closes the client's connection pool of this loop."""
        await self.client.aclose()
