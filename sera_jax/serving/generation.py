"""A request's completions on the engine, whole or streamed, and their OpenAI response records.

Every completion of a request is one ``engine.generate`` call awaited on the server's event loop, so all requests
share the engine's continuous batch and prefix cache (the ``n`` choices of one prompt hit it after the first). No
JAX runs here: the seed becomes raw key data, and the engine's driver thread does the device work. Cancelling (a
client gone mid-stream, a deadline) cancels the engine calls, which frees their rows and KV blocks.
"""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from typing import Any, AsyncIterator, Callable

from sera_jax.sampling.types import GenerationResult, SamplingParams
from sera_jax.serving.completion_text import final_text, stable_prefix
from sera_jax.serving.errors import APIError
from sera_jax.serving.metrics import ServeMetrics
from sera_jax.serving.openai_requests import Plan

FINISH = {"stop_id": "stop", "stop_string": "stop", "length": "length"}


def _params(plan: Plan, tokenizer: Any, cap: int) -> SamplingParams:
    return SamplingParams(max_new_tokens=cap, temperature=plan.temperature, top_p=plan.top_p,
                          stop_ids=() if plan.ignore_eos else tuple(tokenizer.stop_ids), stop_strings=plan.stop,
                          top_logprobs=plan.top_logprobs)


def _calls(plan: Plan) -> list[tuple[int, tuple[int, ...], int]]:
    """Returns (choice index, prompt ids, completion cap) of every completion, prompt-major."""
    return [(p * plan.n + j, ids, plan.max_tokens[p]) for p, ids in enumerate(plan.prompts) for j in range(plan.n)]


def token_logprobs(tokenizer: Any, ids: Any, lps: Any, *, chat: bool, offset: int = 0, tops: Any = ()) -> Any:
    """Returns the ``logprobs`` record of tokens ``ids`` with logprobs ``lps`` and, per token, the most likely
    (id, logprob) pairs ``tops`` (empty: none asked for): chat's ``content`` list, or completions' parallel lists
    (``text_offset`` counted from ``offset``)."""
    def piece(t: int) -> str:
        return tokenizer.decode([int(t)])

    pieces = [piece(t) for t in ids]
    alts = [[(piece(t), float(lp)) for t, lp in pos] for pos in tops] if len(tops) else [[] for _ in pieces]
    if chat:
        return {"content": [{"token": s, "logprob": float(lp), "bytes": list(s.encode("utf-8")),
                             "top_logprobs": [{"token": a, "logprob": x, "bytes": list(a.encode("utf-8"))}
                                              for a, x in alt]}
                            for s, lp, alt in zip(pieces, lps, alts)]}
    offsets, at = [], offset
    for s in pieces:
        offsets.append(at)
        at += len(s)
    return {"tokens": pieces, "token_logprobs": [float(x) for x in lps],
            "top_logprobs": [dict(alt) for alt in alts] if len(tops) else None, "text_offset": offsets}


def _choice(tokenizer: Any, plan: Plan, index: int, result: GenerationResult, *, chat: bool) -> dict:
    text = final_text(tokenizer, result.token_ids, plan.stop)
    lp = token_logprobs(tokenizer, result.token_ids, result.logprobs, chat=chat,
                        tops=result.top_logprobs) if plan.logprobs else None
    out = {"index": index, "logprobs": lp, "finish_reason": FINISH.get(result.finish_reason, "stop"),
           "stop_reason": stop_reason(tokenizer, plan, result)}
    if chat:
        out["message"] = {"role": "assistant", "content": text}
    else:
        out["text"] = text
    return out


def stop_reason(tokenizer: Any, plan: Plan, result: GenerationResult) -> str | int | None:
    """Returns what ended a completion as vLLM's ``stop_reason`` says it: the stop string that matched (left out of
    the text, the OpenAI convention), the stop token's id, or None (the length cap). A client can thus tell a reply
    cut at ``</python>`` from one that ended its turn, which ``finish_reason: "stop"`` leaves open."""
    if result.finish_reason == "stop_string":
        text = tokenizer.decode(list(result.token_ids), skip_special_tokens=True)
        found = [(text.find(s), s) for s in plan.stop if s and s in text]
        return min(found)[1] if found else None
    if result.finish_reason == "stop_id" and result.token_ids:
        return int(result.token_ids[-1])
    return None


def _usage(plan: Plan, results: list[GenerationResult]) -> dict:
    prompt = sum(len(p) for p in plan.prompts)   # each prompt counted once, as OpenAI does for n > 1
    completion = sum(len(r.token_ids) for r in results)
    return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}


def _engine_failure(e: BaseException) -> APIError:
    if isinstance(e, (ValueError, TypeError)):   # the engine's own request checks (e.g. more KV than the pool)
        return APIError(400, str(e))
    return APIError(503, f"the engine failed: {type(e).__name__}: {e}", code="engine_error")


class Completions:
    """Runs plans on one engine (see the module docstring); ``model`` names the served model in responses."""

    def __init__(self, engine: Any, tokenizer: Any, model: str, metrics: ServeMetrics, deadline_s: float):
        self.engine, self.tokenizer, self.model = engine, tokenizer, model
        self.metrics, self.deadline_s = metrics, deadline_s

    def _count(self, plan: Plan, results: list[GenerationResult]) -> None:
        self.metrics.prompt_tokens += sum(len(p) for p in plan.prompts)
        self.metrics.completion_tokens += sum(len(r.token_ids) for r in results)
        self.metrics.cached_prompt_tokens += sum(r.cached_prompt_tokens for r in results)

    async def complete(self, plan: Plan, *, chat: bool) -> dict:
        """Returns the whole response of a non-streamed request; raises APIError (504 past the deadline, 400/503
        when the engine refuses or fails)."""
        tasks = [asyncio.ensure_future(self.engine.generate(ids, _params(plan, self.tokenizer, cap), plan.key_data(i)))
                 for i, ids, cap in _calls(plan)]
        try:
            results = await asyncio.wait_for(asyncio.gather(*tasks), self.deadline_s)
        except TimeoutError:
            self.metrics.deadline_exceeded += 1
            raise APIError(504, f"the request exceeded the server's deadline of {self.deadline_s:g} s",
                           code="deadline_exceeded") from None
        except (ValueError, TypeError, RuntimeError) as e:
            raise _engine_failure(e) from None
        finally:
            for t in tasks:   # one failed or the deadline passed: the others' rows and blocks are freed now
                if not t.done():
                    t.cancel()
        self._count(plan, results)
        choices = [_choice(self.tokenizer, plan, i, r, chat=chat) for (i, _, _), r in zip(_calls(plan), results)]
        return {"id": f"{'chatcmpl' if chat else 'cmpl'}-{uuid.uuid4().hex}",
                "object": "chat.completion" if chat else "text_completion", "created": int(time.time()),
                "model": self.model, "choices": choices, "usage": _usage(plan, results)}

    async def stream(self, plan: Plan, *, chat: bool) -> AsyncIterator[str]:
        """Yields the server-sent events of a streamed request: text deltas as the engine's rounds produce them
        (only text no later token can change), one final chunk per choice with its finish reason, the usage chunk
        when asked, then ``[DONE]``. An engine failure or the deadline ends the stream with an ``error`` event.
        Closing the generator early (the client went away) cancels the engine calls."""
        rid = f"{'chatcmpl' if chat else 'cmpl'}-{uuid.uuid4().hex}"
        created, kind = int(time.time()), "chat.completion.chunk" if chat else "text_completion"
        queue: asyncio.Queue = asyncio.Queue()
        calls = _calls(plan)
        sent_text = {i: "" for i, _, _ in calls}
        sent_tokens = {i: 0 for i, _, _ in calls}
        tasks: list[asyncio.Task] = []

        def progress(i: int) -> Callable:
            return lambda toks, lps, tops=(): queue.put_nowait((i, "progress", toks, (lps, tops)))

        for i, ids, cap in calls:
            t = asyncio.ensure_future(self.engine.generate(ids, _params(plan, self.tokenizer, cap), plan.key_data(i),
                                                           on_progress=progress(i)))
            t.add_done_callback(lambda t, i=i: queue.put_nowait((i, "done", t, None)))
            tasks.append(t)

        def event(i: int, text: str, lp: Any, finish: str | None, first: bool = False,
                  result: GenerationResult | None = None) -> str:
            if chat:
                delta = {"role": "assistant", "content": text} if first else ({"content": text} if text else {})
                choice = {"index": i, "delta": delta, "logprobs": lp, "finish_reason": finish}
            else:
                choice = {"index": i, "text": text, "logprobs": lp, "finish_reason": finish}
            if result is not None:
                choice["stop_reason"] = stop_reason(self.tokenizer, plan, result)
            return "data: " + json.dumps({"id": rid, "object": kind, "created": created, "model": self.model,
                                          "choices": [choice]}) + "\n\n"

        def new_logprobs(i: int, toks: Any, lps: Any, tops: Any) -> Any:
            if not plan.logprobs:
                return None
            k = sent_tokens[i]
            sent_tokens[i] = len(toks)
            return token_logprobs(self.tokenizer, toks[k:], lps[k:], chat=chat, offset=len(sent_text[i]),
                                  tops=tops[k:])

        self.metrics.streams += 1
        finished = False
        results: dict[int, GenerationResult] = {}
        deadline = time.monotonic() + self.deadline_s
        try:
            if chat:
                for i, _, _ in calls:
                    yield event(i, "", None, None, first=True)
            while len(results) < len(calls):
                try:
                    i, what, a, b = await asyncio.wait_for(queue.get(), max(0.0, deadline - time.monotonic()))
                except TimeoutError:
                    self.metrics.deadline_exceeded += 1
                    yield _error_event(APIError(504, f"the request exceeded the server's deadline of "
                                                     f"{self.deadline_s:g} s", code="deadline_exceeded"))
                    finished = True
                    return
                if what == "progress":
                    if i in results:
                        continue
                    text = stable_prefix(self.tokenizer, a, plan.stop)
                    delta, lp = text[len(sent_text[i]):], new_logprobs(i, a, *b)
                    if delta or lp:
                        yield event(i, delta, lp, None)
                        sent_text[i] = text if delta else sent_text[i]
                    continue
                if a.cancelled() or a.exception() is not None:
                    yield _error_event(_engine_failure(a.exception() or RuntimeError("cancelled")))
                    finished = True
                    return
                r = results[i] = a.result()
                text = final_text(self.tokenizer, r.token_ids, plan.stop)
                # The sent text is a prefix of the final one (held back up to any stop string); were a decoder to
                # disagree with itself, the rest is still sent whole rather than dropped.
                rest = text[len(sent_text[i]):] if text.startswith(sent_text[i]) else text
                yield event(i, rest, new_logprobs(i, r.token_ids, r.logprobs, r.top_logprobs),
                            FINISH.get(r.finish_reason, "stop"), result=r)
                sent_text[i] = text
            ordered = [results[i] for i, _, _ in calls]
            self._count(plan, ordered)
            if plan.include_usage:
                yield "data: " + json.dumps({"id": rid, "object": kind, "created": created, "model": self.model,
                                              "choices": [], "usage": _usage(plan, ordered)}) + "\n\n"
            yield "data: [DONE]\n\n"
            finished = True
        finally:
            if not finished:
                self.metrics.disconnects += 1
            for t in tasks:
                if not t.done():
                    t.cancel()


def _error_event(e: APIError) -> str:
    return "data: " + json.dumps(e.body()) + "\n\ndata: [DONE]\n\n"
