"""The agent runtime settings of a run, and of one task group at a given stage and policy version."""

from __future__ import annotations

import dataclasses

from sera_jax.agents.settings import RuntimeSettings
from sera_jax.config import RunConfig


def runtime_settings(cfg: RunConfig, *, evaluation: bool = False, run_index: int = 0) -> RuntimeSettings:
    """Returns the agent runtime settings of the run (training sampling, caps, budgets, determinism). With
    ``evaluation=True``, those of evaluation run ``run_index``: the ``eval`` section's caps, temperature and step
    limit, seed ``train.seed + run_index``."""
    if evaluation:
        e = cfg.eval
        own = dict(max_steps=e.max_steps, max_prompt_tokens=e.max_prompt_tokens, max_context=e.context_tokens,
                   max_new_tokens=e.max_completion_tokens, temperature=e.temperature)
    else:
        r = cfg.rollout
        own = dict(max_steps=cfg.env.max_steps, max_prompt_tokens=r.max_prompt_tokens, max_context=r.context_tokens,
                   max_new_tokens=r.max_completion_tokens, temperature=r.temperature, top_p=r.top_p)
    return RuntimeSettings.for_env(
        cfg.env.name, evaluation=evaluation, max_depth=cfg.env.max_depth,
        deterministic=cfg.train.deterministic_scheduling, seed=cfg.train.seed + run_index,
        prompt_style=cfg.env.prompt_style, token_history=cfg.env.token_history, **own)


def stage_settings(settings: RuntimeSettings, cfg: RunConfig, stage: str, version: int) -> RuntimeSettings:
    """Returns the runtime settings of one task group: the policy version, and the rubric-generation stage's own
    temperature when ``rollout.rubric_stage_temperature`` names one."""
    temp = cfg.rollout.rubric_stage_temperature
    if stage == "rubric_generation" and temp is not None:
        return dataclasses.replace(settings, policy_version=version, temperature=temp)
    return dataclasses.replace(settings, policy_version=version)
