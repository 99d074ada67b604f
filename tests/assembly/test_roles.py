"""assembly.roles.build_roles: each side-call role's backend as a RoleCaller (no network but for an unreachable
endpoint, which is built and fails its calls later), one shared EndpointPolicy for a writer and scorer on one server."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from sera_jax.agents.roles import global_rubric
from sera_jax.assembly.roles import build_roles, close_roles, needs_frozen_engine
from sera_jax.assembly.tokenizer import resolve_tokenizer
from sera_jax.config import UserError, load_config
from sera_jax.sampling.endpoint import EndpointPolicy

TINY = Path(__file__).resolve().parents[2] / "configs" / "tiny_cpu.yaml"
EXEC = ["method.stage_schedule=execution:1"]


def _build(overrides, tmp_path, frozen=None):
    cfg = load_config(TINY, EXEC + list(overrides))
    tok, _ = resolve_tokenizer(cfg.model.tokenizer, None)

    async def main():
        roles = await build_roles(cfg, tokenizer=tok, frozen=frozen, keep_dir=tmp_path)
        await close_roles(roles)
        return roles

    return cfg, tok, asyncio.run(main())


def test_policy_frozen_and_file(tmp_path):
    cfg, tok, roles = _build([], tmp_path)
    assert roles.describe() == {"rubric_writer": "policy", "scorer": "policy", "selector": "policy"}
    assert roles.rubric_writer.generator is None and not needs_frozen_engine(cfg)
    frozen = object()
    cfg, tok, roles = _build(["roles.rubric_writer.backend=file", "roles.scorer.backend=frozen"], tmp_path, frozen)
    assert needs_frozen_engine(cfg)
    assert roles.rubric_writer.rubric == global_rubric("textcraft")
    assert roles.scorer.generator is frozen and roles.scorer.tokenizer is tok and roles.scorer.max_attempts == 1
    with pytest.raises(ValueError, match="no frozen engine"):
        _build(["roles.scorer.backend=frozen"], tmp_path)
    bad = tmp_path / "bad.json"
    bad.write_text("{}")
    with pytest.raises(UserError, match=r"^roles\.rubric_writer\.path: rubric file .*bad\.json is not a valid"):
        _build(["roles.rubric_writer.backend=file", f"roles.rubric_writer.path={bad}"], tmp_path)


def test_endpoint_roles_share_one_policy_and_keep_their_attempts(tmp_path):
    url = "http://127.0.0.1:9/v1"  # nobody listens: built anyway (its calls fail, counted, later)
    over = [f"roles.{r}.{k}={v}" for r in ("rubric_writer", "scorer")
            for k, v in (("backend", "endpoint"), ("endpoint", url), ("model", "m"), ("retries", 2),
                         ("timeout_s", 5), ("api_key_env", "NO_SUCH_KEY_VAR"))]
    cfg, tok, roles = _build(over, tmp_path)
    w, s = roles.rubric_writer, roles.scorer
    assert isinstance(w.generator, EndpointPolicy) and w.generator is s.generator
    assert (w.max_attempts, w.generator.settings.max_attempts) == (3, 1)  # the caller retries, not the client
    assert w.generator.settings.extra_body == {"reasoning_effort": "none"} and w.generator.model == "m"
    assert w.tokenizer is tok  # the server sent none (it is not there): the run's tokenizer counts the budgets
    assert w.generator.client.base_urls == [url] and w.generator.client.timeout_s == 5.0
