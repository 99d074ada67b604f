"""A served policy from a config's ``endpoint`` section: the client, the served model's tokenizer, and the checks
that make a mistake one line before any task runs.

Before anything is evaluated every replica is asked ``GET /models``: an unreachable one is named, and a model name the
server does not serve is refused with the names it does. The tokenizer is ``endpoint.tokenizer`` when given, else
the server's own (``sera-serve`` sends its tokenizer's files at ``GET /v1/sera/tokenizer``; they are kept under the
output directory); a server that sends none (vLLM, SGLang, an API) needs ``--tokenizer``, since prompt budgets and
truncation are counted in the served model's tokens. Replicas that say which tokenizer they serve must agree.
"""

from __future__ import annotations

import base64
import hashlib
import os
from pathlib import Path
from typing import Any

from sera_jax.assembly.tokenizer import resolve_tokenizer
from sera_jax.config import RunConfig, UserError
from sera_jax.model.tokenizer import load_tokenizer
from sera_jax.sampling.endpoint import EndpointPolicy, EndpointSettings
from sera_jax.sampling.openai_client import OpenAIClient


def endpoint_client(cfg: RunConfig) -> OpenAIClient:
    """Returns the client of ``cfg.endpoint`` (its key from the variable ``endpoint.api_key_env`` names); raises
    UserError for a URL that is not one."""
    ep = cfg.endpoint
    try:
        return OpenAIClient(list(ep.urls), api_key=os.environ.get(ep.api_key_env) or None, timeout_s=ep.timeout_s,
                            max_connections=max(ep.concurrency, 1))
    except ValueError as e:
        raise UserError(f"--endpoint: {e}") from None


async def check_models(client: OpenAIClient, model: str) -> list[dict]:
    """Returns each replica's record of ``model`` (from ``GET /models``); raises UserError naming an unreachable
    replica, or listing what a replica serves when ``model`` is not among them."""
    records = []
    for url in client.base_urls:
        data, err = await client.models(url)
        if data is None:
            raise UserError(f"endpoint {url} is unreachable or not an OpenAI-compatible server: {err}")
        match = [m for m in data if m.get("id") == model]
        if not match:
            served = ", ".join(repr(m["id"]) for m in data) or "nothing"
            raise UserError(f"endpoint {url} does not serve model {model!r}; it serves {served}")
        records.append(match[0])
    return records


async def server_tokenizer(client: OpenAIClient, records: list[dict], keep_dir: Path) -> tuple[Any, str] | None:
    """Returns (tokenizer, where it came from) as the servers send it, or None when they send none; raises UserError
    when replicas serve different tokenizers or a sent one does not load."""
    digests = {r.get("sera", {}).get("tokenizer_sha256") for r in records if isinstance(r.get("sera"), dict)}
    if len(digests - {None}) > 1:
        raise UserError(f"the endpoints serve different tokenizers ({', '.join(sorted(digests - {None}))}): "
                        "replicas of one evaluation must serve one model")
    if not digests - {None}:
        return None
    url = client.base_urls[0]
    bundle, err, _ = await client.attempt("sera/tokenizer", None, url=url)
    if bundle is None or not isinstance(bundle.get("files"), dict) or not bundle["files"]:
        raise UserError(f"endpoint {url} names a tokenizer but did not send it: {err or 'no files in the reply'}")
    files = {str(n): base64.b64decode(str(b)) for n, b in bundle["files"].items()}
    digest = hashlib.sha256(b"".join(n.encode() + b"\0" + files[n] for n in sorted(files))).hexdigest()
    if digest not in digests:
        raise UserError(f"endpoint {url} sent a tokenizer whose sha256 {digest[:12]} is not the one it names")
    target = keep_dir / f"tokenizer-{digest[:16]}"
    target.mkdir(parents=True, exist_ok=True)
    for name, data in files.items():
        if Path(name).name != name or name.startswith("."):
            raise UserError(f"endpoint {url} sent a tokenizer file with an unsafe name {name!r}")
        (target / name).write_bytes(data)
    try:
        return load_tokenizer(target), f"{url} (sha256 {digest[:16]})"
    except (OSError, ValueError) as e:
        raise UserError(f"the tokenizer endpoint {url} sent does not load: {e}") from None


async def endpoint_policy(cfg: RunConfig, keep_dir: Path, *, tokenizer: str | None = None) -> EndpointPolicy:
    """Returns the EndpointPolicy of ``cfg.endpoint`` after the start-up checks of the module docstring
    (``tokenizer`` overrides ``endpoint.tokenizer``); raises UserError with one line for each mistake."""
    ep = cfg.endpoint
    if not ep.urls or not ep.model:
        raise UserError("an endpoint policy needs --endpoint URL and --model NAME")
    client = endpoint_client(cfg)
    try:
        records = await check_models(client, ep.model)
        spec = tokenizer or ep.tokenizer
        if spec is not None:
            try:
                tok, path = resolve_tokenizer(spec, None)
            except (OSError, ValueError) as e:
                raise UserError(f"--tokenizer: {e}") from None
            source = str(path)
        else:
            found = await server_tokenizer(client, records, keep_dir)
            if found is None:
                raise UserError(f"endpoint {client.base_urls[0]} does not send its tokenizer (it is not a "
                                "sera-serve): give --tokenizer HF_DIR, the served model's tokenizer, since prompt "
                                "budgets are counted in its tokens")
            tok, source = found
    except BaseException:
        await client.aclose()
        raise
    settings = EndpointSettings(concurrency=ep.concurrency, max_attempts=ep.retries + 1, backoff_s=ep.backoff_s)
    policy = EndpointPolicy(client, ep.model, tok, settings, tokenizer_source=source)
    policy.server_records = records
    return policy
