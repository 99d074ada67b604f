"""The OpenAI-compatible HTTP front of one engine: a Starlette app (served by uvicorn, ``serving.server``).

Routes: ``POST /v1/chat/completions`` (the Qwen chat template), ``POST /v1/completions`` (text or token ids),
``GET /v1/models`` (with a ``sera`` record: where the weights came from, the tokenizer's digest),
``GET /v1/sera/tokenizer`` (the tokenizer's files, for a client that counts prompt budgets), ``GET /health`` (200 while the engine runs, 503 once it failed or closed) and ``GET /metrics``
(JSON: the server's counters and the engine's — waiting and running turns, KV blocks referenced and cached).
A bad request gets an OpenAI-style JSON error (``errors.APIError``); an unexpected failure in a handler is logged and
answered with a 500 of the same shape, and the server keeps serving.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import hashlib
import logging
import time
from pathlib import Path
from typing import Any

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, StreamingResponse
from starlette.routing import Route

from sera_jax.serving.errors import APIError, bad_request
from sera_jax.serving.generation import Completions
from sera_jax.serving.metrics import ServeMetrics
from sera_jax.serving.openai_requests import (Limits, chat_messages, check_model, completion_prompts, make_plan,
                                              parse_json_body)

log = logging.getLogger("sera_jax.serving")


async def read_body(request: Request, limit: int) -> bytes:
    """Returns the request body; raises 413 as soon as it (or its declared length) passes ``limit`` bytes, without
    reading the rest."""
    declared = request.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > limit:
        raise APIError(413, f"request body of {declared} bytes exceeds the server's limit of {limit} bytes",
                       code="body_too_large")
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise APIError(413, f"request body exceeds the server's limit of {limit} bytes", code="body_too_large")
        chunks.append(chunk)
    return b"".join(chunks)


def tokenizer_bundle(tokenizer: Any) -> dict[str, Any]:
    """Returns the served model's tokenizer as ``GET /v1/sera/tokenizer`` sends it: its kind and its files
    (tokenizer.json with the tokenizer_config.json and generation_config.json beside it, or the sentencepiece
    .model), base64-encoded, with their sha256 over the files in name order. A client that evaluates this server
    loads them as they are, so prompt budgets are counted in the served model's own tokens."""
    path = Path(tokenizer.path)
    names = [path.name] + ([n for n in ("tokenizer_config.json", "generation_config.json")
                            if (path.parent / n).is_file()] if tokenizer.kind == "hf" else [])
    files = {n: (path.parent / n).read_bytes() for n in names}
    digest = hashlib.sha256(b"".join(n.encode() + b"\0" + files[n] for n in sorted(files))).hexdigest()
    return {"kind": tokenizer.kind, "files": {n: base64.b64encode(b).decode() for n, b in files.items()},
            "sha256": digest}


def create_app(engine: Any, tokenizer: Any, model: str, limits: Limits, *, close_engine: bool = True,
               source: str = "") -> Starlette:
    """Returns the Starlette app serving ``engine`` (with ``tokenizer``) as ``model``, loaded from ``source`` (said
    in ``/v1/models``). On shutdown (after uvicorn has drained the requests in flight) the engine is closed when
    ``close_engine``."""
    metrics = ServeMetrics()
    completions = Completions(engine, tokenizer, model, metrics, limits.deadline_s)
    vocab = int(engine.cfg.vocab_size)
    bundle = tokenizer_bundle(tokenizer)
    started = int(time.time())

    async def generate(request: Request, chat: bool) -> Any:
        body = parse_json_body(await read_body(request, limits.max_body_bytes), limits.max_body_bytes)
        check_model(body, model)
        if chat:
            try:
                prompts = [tokenizer.encode_chat(chat_messages(body))]
            except (ValueError, TypeError) as e:
                raise bad_request(str(e), "messages") from None
        else:
            prompts = completion_prompts(body, tokenizer, vocab)
        plan = make_plan(body, prompts, limits, chat=chat)
        if plan.stream:
            return StreamingResponse(completions.stream(plan, chat=chat), media_type="text/event-stream",
                                     headers={"Cache-Control": "no-cache"})
        return JSONResponse(await completions.complete(plan, chat=chat))

    def endpoint(name: str, chat: bool):
        async def handle(request: Request) -> Any:
            metrics.requests[name] += 1
            metrics.in_flight += 1
            try:
                response = await generate(request, chat)
            except APIError as e:
                response = e.response()
            finally:
                metrics.in_flight -= 1
            metrics.responses[response.status_code] += 1
            return response
        return handle

    async def models(request: Request) -> JSONResponse:
        metrics.requests["models"] += 1
        return JSONResponse({"object": "list", "data": [{"id": model, "object": "model", "created": started,
                                                          "owned_by": "sera-jax",
                                                          "max_model_len": limits.max_context,
                                                          "sera": {"source": source,
                                                                   "tokenizer_sha256": bundle["sha256"]}}]})

    async def tokenizer_route(request: Request) -> JSONResponse:
        metrics.requests["tokenizer"] += 1
        return JSONResponse(bundle)

    async def health(request: Request) -> JSONResponse:
        if engine.alive:
            return JSONResponse({"status": "ok", "model": model})
        return APIError(503, "the engine is not running", code="engine_stopped").response()

    async def metrics_route(request: Request) -> JSONResponse:
        # As of the driver's last round: the engine's lock is held through every device round.
        stats = engine.last_stats()
        keep = ("waiting", "running", "blocks_total", "blocks_referenced", "blocks_cached", "blocks_available",
                "peak_referenced_blocks", "admitted", "prefill_tokens", "cached_tokens", "generated_tokens",
                "cancelled", "compiles", "device_busy_s")
        return JSONResponse({"server": metrics.as_dict(), "engine": {k: stats[k] for k in keep if k in stats}})

    async def http_error(request: Request, exc: HTTPException) -> JSONResponse:
        return APIError(exc.status_code, str(exc.detail)).response()

    async def server_error(request: Request, exc: Exception) -> JSONResponse:
        log.exception("unhandled error on %s", request.url.path)
        metrics.responses[500] += 1
        return JSONResponse({"error": {"message": f"internal error: {type(exc).__name__}", "type": "server_error",
                                       "param": None, "code": None}}, status_code=500)

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette):
        yield
        if close_engine:
            await asyncio.to_thread(engine.close)

    routes = [Route("/v1/chat/completions", endpoint("chat", True), methods=["POST"]),
              Route("/v1/completions", endpoint("completions", False), methods=["POST"]),
              Route("/v1/models", models, methods=["GET"]),
              Route("/v1/sera/tokenizer", tokenizer_route, methods=["GET"]),
              Route("/health", health, methods=["GET"]),
              Route("/metrics", metrics_route, methods=["GET"])]
    app = Starlette(routes=routes, lifespan=lifespan,
                    exception_handlers={HTTPException: http_error, Exception: server_error})
    app.state.metrics = metrics
    return app
