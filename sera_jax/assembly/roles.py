"""The side-call roles a config names (``roles:``, ``config/roles.py``), built: who writes rubrics, who scores them
and who selects among best-of-N candidates, as ``agents.roles.RoleCallers``.

An endpoint role gets an ``EndpointPolicy`` (``sampling/endpoint.py``: the one HTTP client, the same generator
interface as ``sera-eval --endpoint``), its address and model from the role's section or, when null, from
``$SERA_EXTERNAL_ENDPOINT`` / ``$SERA_EXTERNAL_MODEL``, its key from the variable ``api_key_env`` names. Its prompt
budgets are counted in the served model's tokenizer: the role's ``tokenizer`` when given, else the server's own
(``sera-serve`` sends it), else the run's (an API that sends none: counted in our tokens, and an overlong prompt
cut by them). A server that cannot be reached is not refused here: it fails its calls, which the launchers count
and survive (docs/design/roles.md, faults), as the judge's do.

A file-backed rubric writer reads its rubric once, validated by the same parser as a generated rubric: the role's
``path``, else the environment's shipped global rubric (``sera_jax/assets/rubrics/<env>.json``).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from sera_jax.agents.judge import ChatJudge
from sera_jax.agents.roles import RoleCaller, RoleCallers, global_rubric_path, load_rubric_file
from sera_jax.assembly.endpoint import server_tokenizer
from sera_jax.assembly.tokenizer import resolve_tokenizer
from sera_jax.config import ConfigError, RunConfig, UserError
from sera_jax.config.roles import ENDPOINT_ENV, MODEL_ENV, backend, role_section
from sera_jax.sampling.endpoint import EndpointPolicy, EndpointSettings
from sera_jax.sampling.openai_client import OpenAIClient

SIDE_ROLES = ("rubric_writer", "scorer")


def endpoint_address(cfg: RunConfig, role: str) -> tuple[str, str]:
    """Returns (base URL, model) of an endpoint role: its section's, else ``$SERA_EXTERNAL_ENDPOINT`` /
    ``$SERA_EXTERNAL_MODEL``; raises ConfigError naming the key when neither gives one."""
    sec = role_section(cfg, role)
    url = sec.endpoint or os.environ.get(ENDPOINT_ENV)
    model = sec.model or os.environ.get(MODEL_ENV)
    if not url:
        raise ConfigError(f"roles.{role}.endpoint: null and ${ENDPOINT_ENV} is not set")
    if not model:
        raise ConfigError(f"roles.{role}.model: null and ${MODEL_ENV} is not set")
    return url, model


def endpoint_client(cfg: RunConfig, role: str) -> tuple[OpenAIClient, str]:
    """Returns (the role's client, its model name); raises UserError for a URL that is not one."""
    sec = role_section(cfg, role)
    url, model = endpoint_address(cfg, role)
    try:
        client = OpenAIClient(url, api_key=os.environ.get(sec.api_key_env) or None, timeout_s=sec.timeout_s,
                              max_connections=sec.concurrency)
    except ValueError as e:
        raise UserError(f"roles.{role}.endpoint: {e}") from None
    return client, model


async def endpoint_tokenizer(cfg: RunConfig, role: str, client: OpenAIClient, model: str, run_tokenizer: Any,
                             keep_dir: Path) -> tuple[Any, str]:
    """Returns (tokenizer, where it came from) of an endpoint role (see the module docstring)."""
    sec = role_section(cfg, role)
    if sec.tokenizer is not None:
        try:
            tok, path = resolve_tokenizer(sec.tokenizer, None)
        except (OSError, ValueError) as e:
            raise UserError(f"roles.{role}.tokenizer: {e}") from None
        return tok, str(path)
    data, _ = await client.models(client.base_urls[0])
    records = [m for m in (data or []) if m.get("id") == model]
    if records:
        found = await server_tokenizer(client, records, keep_dir)
        if found is not None:
            return found
    return run_tokenizer, "the run's tokenizer (the server sent none)"


async def build_roles(cfg: RunConfig, *, tokenizer: Any, frozen: Any = None, keep_dir: Path,
                      min_items: int = 2) -> RoleCallers:
    """Returns the run's RoleCallers: the rubric writer, the scorer and the selector's oracle judge as the config
    names them (``frozen``: the frozen-policy engine, needed when a role is ``frozen``)."""
    callers: dict[str, RoleCaller] = {}
    shared: dict[tuple, Any] = {}   # one EndpointPolicy per (address, model): writer and scorer share a server
    for role in SIDE_ROLES:
        b = backend(cfg, role)
        sec = role_section(cfg, role)
        if b == "policy":
            callers[role] = RoleCaller(role)
        elif b == "frozen":
            if frozen is None:
                raise ValueError(f"the {role} is the frozen policy but no frozen engine was built")
            callers[role] = RoleCaller(role, "frozen", generator=frozen, tokenizer=tokenizer)
        elif b == "file":
            path = sec.path or global_rubric_path(cfg.env.name)
            try:
                rubric = load_rubric_file(path, min_items)
            except ValueError as e:
                raise UserError(f"roles.{role}.path: {e}") from None
            callers[role] = RoleCaller(role, "file", rubric=rubric)
        else:
            address = (*endpoint_address(cfg, role), sec.tokenizer, sec.api_key_env, sec.timeout_s, sec.concurrency,
                       sec.thinking_off)
            if address not in shared:
                client, model = endpoint_client(cfg, role)
                tok, source = await endpoint_tokenizer(cfg, role, client, model, tokenizer, keep_dir)
                # One attempt per request here: the role's caller retries a failed or invalid reply itself.
                extra = {"reasoning_effort": "none"} if sec.thinking_off else {}
                shared[address] = EndpointPolicy(client, model, tok, EndpointSettings(
                    concurrency=sec.concurrency, max_attempts=1, backoff_s=sec.backoff_s, extra_body=extra),
                    tokenizer_source=source)
            policy = shared[address]
            callers[role] = RoleCaller(role, "endpoint", generator=policy, tokenizer=policy.tokenizer,
                                       max_attempts=sec.retries + 1, backoff_s=sec.backoff_s)
    return RoleCallers(rubric_writer=callers["rubric_writer"], scorer=callers["scorer"],
                       selector_judge=selector_judge(cfg))


def selector_judge(cfg: RunConfig) -> ChatJudge | None:
    """Returns the selector's binary judge when an endpoint selects (the reference's ``oracle`` mode: T and token
    cap the judge section's, attempts, timeout and concurrency the role's), else None (the policy's rubric)."""
    if backend(cfg, "selector") != "endpoint":
        return None
    sec = role_section(cfg, "selector")
    url, model = endpoint_address(cfg, "selector")
    try:
        return ChatJudge(url, model, api_key=os.environ.get(sec.api_key_env) or None, timeout_s=sec.timeout_s,
                         max_attempts=sec.retries + 1, backoff_s=sec.backoff_s, temperature=cfg.judge.temperature,
                         max_tokens=cfg.judge.max_tokens, max_connections=sec.concurrency,
                         style=cfg.env.prompt_style,
                         extra_body=None if sec.thinking_off else {})  # None: the judge's thinking-off fields
    except ValueError as e:
        raise UserError(f"roles.selector.endpoint: {e}") from None


def needs_frozen_engine(cfg: RunConfig) -> bool:
    """Returns whether a side-call role (writer, scorer) is the frozen starting policy."""
    return any(backend(cfg, r) == "frozen" for r in SIDE_ROLES)


async def close_roles(roles: RoleCallers | None) -> None:
    """Closes the endpoint roles' connection pools of this loop."""
    if roles is None:
        return
    for caller in (roles.rubric_writer, roles.scorer):
        if caller.backend == "endpoint":
            await caller.generator.aclose()
    if roles.selector_judge is not None:
        await roles.selector_judge.aclose()
