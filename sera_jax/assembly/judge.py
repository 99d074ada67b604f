"""The judge a config names (``judge.kind``, or ``roles.judge`` in the new spelling: config/roles.py), as
``agents.judge.make_judge``'s settings."""

from __future__ import annotations

import os
from typing import Any

from sera_jax.agents.environments import environment
from sera_jax.config import ConfigError, RunConfig
from sera_jax.config.roles import ENDPOINT_ENV, MODEL_ENV, judge_kind

JUDGE_PROMPT_TOKENS = 10240  # docs/design/recipes.md §1b: the judge's prompt budget


def judge_settings(cfg: RunConfig, *, kind: str | None = None) -> dict[str, Any]:
    """Returns ``make_judge``'s settings for the run's judge (``kind`` overrides the config's, in judge.kind's
    spelling): an OpenAI-compatible endpoint (``roles.judge.endpoint`` or ``judge.endpoint``, else the variable
    ``judge.endpoint_env`` names, else ``$SERA_EXTERNAL_ENDPOINT``; the model likewise, else
    ``$SERA_EXTERNAL_MODEL``; key from ``$SERA_JUDGE_API_KEY``; the env's prompt style, so a tiny policy behind
    ``sera-serve`` gets the compact prompt the frozen engine would) or an engine (``policy_frozen``: a frozen copy of
    the starting policy; ``policy``: the trainable policy's own engine)."""
    j, rj = cfg.judge, cfg.roles.judge
    kind = kind or judge_kind(cfg)
    if kind == "openai":
        endpoint = rj.endpoint or j.endpoint or os.environ.get(j.endpoint_env) or os.environ.get(ENDPOINT_ENV)
        if not endpoint:
            raise ConfigError(f"judge.endpoint: null and neither ${j.endpoint_env} nor ${ENDPOINT_ENV} is set")
        model = rj.model or j.model or os.environ.get(MODEL_ENV)
        key_env = "SERA_JUDGE_API_KEY" if rj.backend is None else rj.api_key_env
        return {"kind": "chat", "base_url": endpoint, "model": model, "temperature": j.temperature,
                "max_tokens": j.max_tokens, "max_attempts": j.retries + 1, "timeout_s": j.timeout_s,
                "api_key": os.environ.get(key_env), "style": cfg.env.prompt_style}
    # The frozen copy is served by an engine of the policy's context (rollout.context_tokens): the request's prompt
    # is cut to what is left of it after the completion cap, never above the reference judge's 10,240-token budget
    # (a 10,240-token prompt on the tiny default's small engine would make every label an error).
    prompt = max(1, min(JUDGE_PROMPT_TOKENS, cfg.rollout.context_tokens - j.max_tokens))
    return {"kind": "policy_frozen", "temperature": j.temperature, "max_new_tokens": j.max_tokens,
            "max_prompt_tokens": prompt, "max_attempts": j.retries + 1, "style": cfg.env.prompt_style,
            "backend": "policy" if kind == "policy" else "frozen"}


def judge_roles(cfg: RunConfig) -> tuple[bool, bool]:
    """Returns (labels rubric-stage branches, labels the RAO family's sub-agents): a judge-labelled environment
    (TextWorld) asks a judge for RT branch labels in the rubric-generation stage and for the RAO family's sub-agent
    rewards; a programmatic one (TextCraft) never."""
    method = cfg.method_config()
    judged = not environment(cfg.env.name).programmatic
    return (judged and method.uses("rubric_generation"), judged and method.execution_reward == "rao")


def uses_frozen_judge(cfg: RunConfig) -> bool:
    """Returns whether the run builds a ``policy_frozen`` judge engine (a frozen copy of the initial policy)."""
    return any(judge_roles(cfg)) and judge_kind(cfg) == "policy_frozen"


def uses_policy_judge(cfg: RunConfig) -> bool:
    """Returns whether the trainable policy's own engine answers the judge's requests (``roles.judge.backend:
    policy``)."""
    return any(judge_roles(cfg)) and judge_kind(cfg) == "policy"
