"""The judge a config names, as ``agents.judge.make_judge``'s settings."""

from __future__ import annotations

import os
from typing import Any

from sera_jax.config import ConfigError, RunConfig


def judge_settings(cfg: RunConfig) -> dict[str, Any]:
    """Returns ``make_judge``'s settings for ``cfg.judge``: an OpenAI-compatible endpoint (``judge.endpoint``, else
    the variable ``judge.endpoint_env`` names; key from ``$SERA_JUDGE_API_KEY``) or the policy_frozen engine."""
    j = cfg.judge
    if j.kind == "openai":
        endpoint = j.endpoint or os.environ.get(j.endpoint_env)
        if not endpoint:
            raise ConfigError(f"judge.endpoint: null and ${j.endpoint_env} is not set")
        return {"kind": "chat", "base_url": endpoint, "model": j.model, "temperature": j.temperature,
                "max_tokens": j.max_tokens, "max_attempts": j.retries + 1, "timeout_s": j.timeout_s,
                "api_key": os.environ.get("SERA_JUDGE_API_KEY")}
    return {"kind": "policy_frozen", "temperature": j.temperature, "max_new_tokens": j.max_tokens,
            "max_attempts": j.retries + 1}


def judge_roles(cfg: RunConfig) -> tuple[bool, bool]:
    """Returns (labels rubric-stage branches, labels the RAO family's sub-agents): TextWorld asks a judge for RT
    branch labels in the rubric-generation stage and for the RAO family's sub-agent rewards; TextCraft never."""
    method = cfg.method_config()
    textworld = cfg.env.name != "textcraft"
    return (textworld and method.uses("rubric_generation"), textworld and method.execution_reward == "rao")


def uses_frozen_judge(cfg: RunConfig) -> bool:
    """Returns whether the run builds a ``policy_frozen`` judge engine (a frozen copy of the initial policy)."""
    return any(judge_roles(cfg)) and cfg.judge.kind == "policy_frozen"
