"""The one HTTP client of sera-jax: requests to OpenAI-compatible servers (``/v1/chat/completions``,
``/v1/completions``, ``/v1/models``) over ``httpx``'s async client.

Used by every model role that a server plays: the evaluated policy (``sampling/endpoint.py``) and the judge
(``agents/judge.py``'s ``ChatJudge``). One connection pool per event loop (a pool belongs to the loop that opened it;
keep-alive across requests, at most ``max_connections`` open). Several base URLs are replicas of one model: each
request goes to the next one in turn (round-robin), so a retry after a failure lands on another replica.

Every request is bounded as a whole by ``timeout_s`` (connect, a slow first byte, a server trickling bytes).
``attempt`` never raises for what a server or the network does: it returns the parsed JSON, or None with the cause
in words that name the URL (HTTP status and the server's own error message, time-out, unreachable, a body that is
not the JSON object the route promises). The key is given by the caller; it is read from an environment variable
named in the config, never taken from a command line.
"""

from __future__ import annotations

import asyncio
import itertools
import json
from typing import Any, Mapping, Sequence
from urllib.parse import urlsplit

import httpx

ROUTES = ("chat/completions", "completions", "models")


def normalise_base_url(url: str) -> str:
    """Returns an OpenAI base URL for ``url``: without a trailing ``/`` or a route name, with ``/v1`` added when the
    URL has no path (``http://h:8000`` → ``http://h:8000/v1``). Raises ValueError for a URL that is not http(s)."""
    text = str(url).strip().rstrip("/")
    for route in ROUTES:
        if text.endswith("/" + route):
            text = text[: -len(route) - 1]
    parts = urlsplit(text)
    if parts.scheme not in ("http", "https") or not parts.netloc:
        raise ValueError(f"endpoint {url!r} is not an http(s) URL such as http://host:8000/v1")
    return text + "/v1" if parts.path in ("", "/") else text


def usage_tokens(payload: Any) -> dict[str, int] | None:
    """Returns {"prompt_tokens", "completion_tokens"} from a completion response's ``usage`` field, or None when it
    has none (or not as non-negative integers)."""
    usage = payload.get("usage") if isinstance(payload, dict) else None
    if not isinstance(usage, dict):
        return None
    p, c = usage.get("prompt_tokens"), usage.get("completion_tokens")
    if not all(isinstance(x, int) and not isinstance(x, bool) and x >= 0 for x in (p, c)):
        return None
    return {"prompt_tokens": p, "completion_tokens": c}


def _server_message(resp: httpx.Response) -> str:
    """Returns the server's own error message (OpenAI's ``{"error": {"message"}}``), cut to 300 characters."""
    try:
        err = json.loads(resp.content.decode("utf-8", "replace")).get("error")
        msg = err.get("message") if isinstance(err, dict) else err
    except (ValueError, AttributeError):
        msg = None
    text = str(msg) if msg else resp.content[:300].decode("utf-8", "replace")
    return " ".join(text.split())[:300]


class OpenAIClient:
    """Requests to one model served at ``base_urls`` (replicas, round-robin); see the module docstring."""

    def __init__(self, base_urls: str | Sequence[str], *, api_key: str | None = None, timeout_s: float = 60.0,
                 max_connections: int = 64):
        urls = [base_urls] if isinstance(base_urls, str) else list(base_urls)
        if not urls:
            raise ValueError("no endpoint given")
        if timeout_s <= 0:
            raise ValueError(f"timeout_s must be positive, got {timeout_s}")
        self.base_urls = [normalise_base_url(u) for u in urls]
        self.api_key, self.timeout_s, self.max_connections = api_key, float(timeout_s), int(max_connections)
        self._turn = itertools.cycle(range(len(self.base_urls)))
        self._client: httpx.AsyncClient | None = None
        self._client_loop: asyncio.AbstractEventLoop | None = None

    def next_url(self) -> str:
        """Returns the base URL the next request goes to (round-robin over the replicas)."""
        return self.base_urls[next(self._turn)]

    def _http(self) -> httpx.AsyncClient:
        loop = asyncio.get_running_loop()
        if self._client is None or self._client_loop is not loop or self._client.is_closed:
            self._client = httpx.AsyncClient(timeout=httpx.Timeout(self.timeout_s),
                                             limits=httpx.Limits(max_connections=self.max_connections))
            self._client_loop = loop
        return self._client

    def headers(self) -> dict[str, str]:
        """Returns the request headers (the bearer key when one is set)."""
        out = {"Content-Type": "application/json"}
        if self.api_key:
            out["Authorization"] = f"Bearer {self.api_key}"
        return out

    async def aclose(self) -> None:
        """Closes this loop's connection pool (a later request opens a new one)."""
        if self._client is not None and self._client_loop is asyncio.get_running_loop():
            await self._client.aclose()
        self._client = self._client_loop = None

    async def request(self, route: str, body: Mapping[str, Any] | None = None, *, url: str | None = None
                      ) -> tuple[dict, str]:
        """Returns (the response's JSON object, the base URL that answered) of one request: POST ``body`` to
        ``route`` (GET when ``body`` is None) on ``url`` or the next replica. Raises httpx errors, TimeoutError
        and ValueError (a body that is not a JSON object) for the caller to classify; see :meth:`attempt`."""
        base = url or self.next_url()
        target = f"{base}/{route}"

        async def send() -> httpx.Response:
            if body is None:
                return await self._http().get(target, headers=self.headers())
            return await self._http().post(target, content=json.dumps(body).encode(), headers=self.headers())

        # httpx's timeout is per read; the whole request (a server trickling bytes) is bounded here.
        resp = await asyncio.wait_for(send(), self.timeout_s)
        resp.raise_for_status()
        payload = json.loads(resp.content.decode("utf-8", "replace"))
        if not isinstance(payload, dict):
            raise ValueError(f"the response is a JSON {type(payload).__name__}, not an object")
        return payload, base

    async def attempt(self, route: str, body: Mapping[str, Any] | None = None, *, url: str | None = None
                      ) -> tuple[dict | None, str, str]:
        """Returns (JSON object | None, why there is none, the base URL asked) of one request; never raises for
        what the server or the network does (cancellation passes through)."""
        base = url or self.next_url()
        target = f"{base}/{route}"
        try:
            payload, _ = await self.request(route, body, url=base)
            return payload, "", base
        except httpx.HTTPStatusError as e:
            return None, f"HTTP {e.response.status_code} from {target}: {_server_message(e.response)}", base
        except (TimeoutError, httpx.TimeoutException):
            return None, f"no reply from {target} within {self.timeout_s:g} s", base
        except (httpx.TransportError, OSError) as e:
            return None, f"cannot reach {target}: {type(e).__name__}: {e}", base
        except (ValueError, UnicodeError) as e:
            return None, f"malformed response from {target}: {type(e).__name__}: {e}", base

    async def models(self, url: str) -> tuple[list[dict] | None, str]:
        """Returns (the model records ``GET /models`` lists at ``url``, "") or (None, why not)."""
        payload, err, _ = await self.attempt("models", None, url=url)
        if payload is None:
            return None, err
        data = payload.get("data")
        if not isinstance(data, list) or not all(isinstance(m, dict) and isinstance(m.get("id"), str) for m in data):
            return None, f"malformed response from {url}/models: no list of models with string ids"
        return data, ""
