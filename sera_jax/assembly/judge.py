"""The judge a config names, as ``agents.judge.make_judge``'s settings."""

from __future__ import annotations

import os
from typing import Any

from sera_jax.agents.environments import environment
from sera_jax.config import ConfigError, RunConfig

JUDGE_PROMPT_TOKENS = 10240  # docs/design/recipes.md §1b: the judge's prompt budget


def judge_settings(cfg: RunConfig) -> dict[str, Any]:
    """Returns ``make_judge``'s settings for ``cfg.judge``: an OpenAI-compatible endpoint (``judge.endpoint``, else
    the variable ``judge.endpoint_env`` names; key from ``$SERA_JUDGE_API_KEY``; the env's prompt style, so a tiny
    policy behind ``sera-serve`` gets the compact prompt the frozen engine would) or the policy_frozen engine."""
    j = cfg.judge
    if j.kind == "openai":
        endpoint = j.endpoint or os.environ.get(j.endpoint_env)
        if not endpoint:
            raise ConfigError(f"judge.endpoint: null and ${j.endpoint_env} is not set")
        return {"kind": "chat", "base_url": endpoint, "model": j.model, "temperature": j.temperature,
                "max_tokens": j.max_tokens, "max_attempts": j.retries + 1, "timeout_s": j.timeout_s,
                "api_key": os.environ.get("SERA_JUDGE_API_KEY"), "style": cfg.env.prompt_style}
    # The frozen copy is served by an engine of the policy's context (rollout.context_tokens): the request's prompt
    # is cut to what is left of it after the completion cap, never above the reference judge's 10,240-token budget
    # (a 10,240-token prompt on the tiny default's small engine would make every label an error).
    prompt = max(1, min(JUDGE_PROMPT_TOKENS, cfg.rollout.context_tokens - j.max_tokens))
    return {"kind": "policy_frozen", "temperature": j.temperature, "max_new_tokens": j.max_tokens,
            "max_prompt_tokens": prompt, "max_attempts": j.retries + 1, "style": cfg.env.prompt_style}


def judge_roles(cfg: RunConfig) -> tuple[bool, bool]:
    """Returns (labels rubric-stage branches, labels the RAO family's sub-agents): a judge-labelled environment
    (TextWorld) asks a judge for RT branch labels in the rubric-generation stage and for the RAO family's sub-agent
    rewards; a programmatic one (TextCraft) never."""
    method = cfg.method_config()
    judged = not environment(cfg.env.name).programmatic
    return (judged and method.uses("rubric_generation"), judged and method.execution_reward == "rao")


def uses_frozen_judge(cfg: RunConfig) -> bool:
    """Returns whether the run builds a ``policy_frozen`` judge engine (a frozen copy of the initial policy)."""
    return any(judge_roles(cfg)) and cfg.judge.kind == "policy_frozen"
