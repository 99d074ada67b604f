"""A misbehaving OpenAI-compatible server for the tests: a Starlette app, served by uvicorn in its own process, that
forwards every request to a real upstream server (``sera-serve``) and spoils some chat completions: every
``--fail-every``-th one is answered HTTP 500 with an OpenAI error body, every ``--garbage-every``-th one HTTP 200 with
a body that is not JSON. ``/health``, ``/v1/models`` and the rest pass through untouched, so the client's start-up
checks see a healthy server.

``python -m tests.serving.faulty_proxy --upstream URL --port PORT [--fail-every N] [--garbage-every M]``; prints
``faulty-proxy: listening on http://127.0.0.1:PORT`` once bound.
"""

from __future__ import annotations

import argparse
import itertools

import httpx
import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route


def make_app(upstream: str, fail_every: int, garbage_every: int) -> Starlette:
    count = itertools.count(1)
    client = httpx.AsyncClient(base_url=upstream.rstrip("/"), timeout=600.0)

    async def forward(request: Request) -> Response:
        path = request.url.path
        if path.endswith("/chat/completions"):
            n = next(count)
            if fail_every and n % fail_every == 0:
                return JSONResponse({"error": {"message": f"injected failure of chat request {n}",
                                               "type": "server_error"}}, status_code=500)
            if garbage_every and n % garbage_every == 0:
                return Response(b"<html>upstream garbage", status_code=200, media_type="application/json")
        body = await request.body()
        headers = {k: v for k, v in request.headers.items() if k.lower() in ("content-type", "authorization")}
        r = await client.request(request.method, path, content=body, headers=headers,
                                 params=dict(request.query_params))
        return Response(r.content, status_code=r.status_code, media_type=r.headers.get("content-type"))

    return Starlette(routes=[Route("/{path:path}", forward, methods=["GET", "POST"])])


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--upstream", required=True)
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--fail-every", type=int, default=0)
    p.add_argument("--garbage-every", type=int, default=0)
    a = p.parse_args()
    print(f"faulty-proxy: listening on http://127.0.0.1:{a.port}", flush=True)
    uvicorn.run(make_app(a.upstream, a.fail_every, a.garbage_every), host="127.0.0.1", port=a.port,
                log_level="warning")


if __name__ == "__main__":
    main()
