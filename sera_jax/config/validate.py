"""Cross-field validation of a RunConfig, and the mesh check against the model's dimensions.

Every error is a ``ConfigError`` whose message starts with the full key. Validation traces shapes only
(``jax.eval_shape``); it allocates and computes nothing.
"""

from __future__ import annotations

import dataclasses
import functools
from pathlib import Path

from sera_jax.agents import environments
from sera_jax.config.roles import backend, check_roles
from sera_jax.config.schema import ConfigError, RunConfig
from sera_jax.model import Qwen3Config, abstract_params, param_logical_axes
from sera_jax.parallel.rules import SAMPLE_RULES, TRAIN_RULES, check_divisible
from sera_jax.rl.losses import LOSSES
from sera_jax.rl.stages import method_config, parse_schedule


def validate(cfg: RunConfig, *, num_devices: int | None = None, check_paths: bool = False) -> None:
    """Raises ConfigError (naming the key) for values that are well typed but wrong together; returns None."""
    def need(cond: bool, key: str, msg: str) -> None:
        if not cond:
            raise ConfigError(f"{key}: {msg}")

    # env.name first: the checks below read the environment's registration (agents.environments).
    need(cfg.env.name in environments.names(), "env.name",
         f"expected one of {list(environments.names())}, got {cfg.env.name!r}")
    env = environments.environment(cfg.env.name)
    m = cfg.model
    need(m.preset is not None or m.hf_dir is not None, "model.preset", "give a preset or model.hf_dir")
    need(m.logits_chunk is None or m.logits_chunk > 0, "model.logits_chunk", "must be positive")
    if check_paths and m.hf_dir is not None:
        need((Path(m.hf_dir) / "config.json").is_file(), "model.hf_dir", f"no config.json in {m.hf_dir}")
    try:
        model_cfg = cfg.model_config()
    except (ValueError, FileNotFoundError) as e:
        key = "model.preset" if m.preset is not None else "model.hf_dir"
        raise ConfigError(f"{key}: {e}") from e
    if check_paths and m.hf_dir is not None and m.preset is not None:
        hf = Qwen3Config.from_hf_json(m.hf_dir, dtype=model_cfg.dtype, param_dtype=model_cfg.param_dtype,
                                      remat=model_cfg.remat, logits_chunk=model_cfg.logits_chunk)
        diff = [f.name for f in dataclasses.fields(hf) if f.name != "max_position_embeddings"
                and getattr(hf, f.name) != getattr(model_cfg, f.name)]
        need(not diff, "model.hf_dir", f"config.json differs from preset {m.preset!r} in {diff}")

    need(cfg.step.loss in LOSSES, "step.loss", f"expected one of {sorted(LOSSES)}, got {cfg.step.loss!r}")
    need(0 <= cfg.step.ratio_min < cfg.step.ratio_max, "step.ratio_max", "need 0 ≤ ratio_min < ratio_max")
    try:
        method_config(cfg.method.name)
    except KeyError as e:
        raise ConfigError(f"method.name: {e.args[0]}") from None
    if cfg.method.stage_schedule is not None:
        try:
            parse_schedule(cfg.method.stage_schedule)
        except ValueError as e:
            raise ConfigError(f"method.stage_schedule: {e}") from None
    need(cfg.method.branching_factor is None or cfg.method.branching_factor >= 2,
         "method.branching_factor", "must be ≥ 2 (a rubric is rewarded for ranking its branches)")
    need(cfg.method.max_counterfactual_envs_per_rollout is None or cfg.method.max_counterfactual_envs_per_rollout >= 1,
         "method.max_counterfactual_envs_per_rollout", "must be ≥ 1")
    try:
        method = cfg.method_config()
    except ValueError as e:
        raise ConfigError(f"method: {e}") from None
    need(cfg.method.max_head_offpolicyness is None or cfg.method.max_head_offpolicyness >= 0,
         "method.max_head_offpolicyness", "must be ≥ 0")

    for section in ("env", "rollout", "batch", "train", "eval", "judge"):
        for f in dataclasses.fields(getattr(cfg, section)):
            v = getattr(getattr(cfg, section), f.name)
            if isinstance(v, int) and not isinstance(v, bool) and f.name not in ("seed", "every", "retries",
                                                                                  "speculative_groups_per_rank",
                                                                                  "data_seed", "rubric_probe_groups",
                                                                                  "rubric_probe_seed", "max_depth"):
                need(v > 0, f"{section}.{f.name}", f"must be positive, got {v}")
            if isinstance(v, int) and not isinstance(v, bool) and f.name in ("every", "retries",
                                                                             "speculative_groups_per_rank",
                                                                             "rubric_probe_groups", "max_depth"):
                need(v >= 0, f"{section}.{f.name}", f"must be ≥ 0, got {v}")
    need(cfg.env.max_depth <= 8, "env.max_depth", f"at most 8, got {cfg.env.max_depth}")
    need(cfg.rollout.trees_per_task >= 2, "rollout.trees_per_task", "leave-one-out baselines need at least 2")
    need(cfg.rollout.temperature >= 0, "rollout.temperature", "must be ≥ 0")
    need(cfg.eval.temperature >= 0, "eval.temperature", "must be ≥ 0")
    ep = cfg.endpoint
    need(ep.concurrency >= 1, "endpoint.concurrency", "must be ≥ 1")
    need(ep.timeout_s > 0, "endpoint.timeout_s", "must be positive")
    need(ep.retries >= 0, "endpoint.retries", "must be ≥ 0")
    need(ep.backoff_s >= 0, "endpoint.backoff_s", "must be ≥ 0")
    need(not ep.urls or bool(ep.model), "endpoint.model", "a served policy needs the model name its server serves")
    need(cfg.eval.rubric_probe_groups == 0 or env.programmatic, "eval.rubric_probe_groups",
         "the rubric probe needs TextCraft's programmatic branch labels (0 for other environments)")
    rtp = cfg.rollout.rubric_stage_tasks_per_step
    need(rtp is None or rtp > 0, "rollout.rubric_stage_tasks_per_step", f"must be positive (or null), got {rtp}")
    rst = cfg.rollout.rubric_stage_temperature
    need(rst is None or rst > 0, "rollout.rubric_stage_temperature", f"must be positive (or null), got {rst}")
    rt = cfg.method.rubric_temperature
    need(rt is None or rt > 0, "method.rubric_temperature", f"must be positive (or null), got {rt}")
    w = cfg.warmstart
    need(0 <= w.delegate_prob <= 1, "warmstart.delegate_prob", f"must lie in [0, 1], got {w.delegate_prob}")
    need(0 <= w.fail_prob <= 1, "warmstart.fail_prob", f"must lie in [0, 1], got {w.fail_prob}")
    need(0 <= w.exhaust_share <= 1, "warmstart.exhaust_share", f"must lie in [0, 1], got {w.exhaust_share}")
    need(0 <= w.rubric_target_prob <= 1, "warmstart.rubric_target_prob",
         f"must lie in [0, 1], got {w.rubric_target_prob}")
    need(w.rubric_target_prob == 1 or cfg.env.prompt_style == "compact", "warmstart.rubric_target_prob",
         "< 1 (distractor rubrics) needs env.prompt_style: compact (the oracle reads the compact scoring prompt)")
    need(w.lr > 0, "warmstart.lr", f"must be positive, got {w.lr}")
    need(w.demo_max_steps is None or w.demo_max_steps >= 1, "warmstart.demo_max_steps",
         f"must be ≥ 1 (or null), got {w.demo_max_steps}")
    need(w.child_rule == "greedy" or "warmstart.child_rule" in env.options, "warmstart.child_rule",
         "is TextWorld-Sync's (the TextCraft oracle's sub-agents follow their own goal already)")
    need(w.copy_task_set is None or "warmstart.copy_task_set" in env.options, "warmstart.copy_task_set",
         "is TextWorld-Sync's (TextCraft's first-turn datums copy the demo tasks' goals)")
    need(not w.decay or w.steps > w.warmup_steps, "warmstart.decay",
         f"needs steps ({w.steps}) > warmup_steps ({w.warmup_steps})")
    need(0 <= w.fork_demo_tasks <= w.demo_tasks, "warmstart.fork_demo_tasks",
         f"must lie in [0, warmstart.demo_tasks = {w.demo_tasks}], got {w.fork_demo_tasks}")
    need(0 < cfg.rollout.top_p <= 1, "rollout.top_p", "must lie in (0, 1]")
    eng = cfg.rollout.engines
    need(eng is None or eng >= 1, "rollout.engines", f"must be ≥ 1 (or null), got {eng}")
    for sec in ("rollout", "eval"):
        s = getattr(cfg, sec)
        need(s.max_prompt_tokens + s.max_completion_tokens <= s.context_tokens, f"{sec}.context_tokens",
             f"{s.context_tokens} < max_prompt_tokens {s.max_prompt_tokens} + max_completion_tokens "
             f"{s.max_completion_tokens}")
    need(cfg.rollout.context_tokens <= model_cfg.max_position_embeddings, "rollout.context_tokens",
         f"{cfg.rollout.context_tokens} exceeds the model's max_position_embeddings "
         f"{model_cfg.max_position_embeddings}")
    b = cfg.batch
    need(list(b.buckets) == sorted(set(b.buckets)), "batch.buckets", f"must be strictly increasing, got {b.buckets}")
    need(b.buckets[-1] >= cfg.rollout.context_tokens, "batch.buckets",
         f"largest bucket {b.buckets[-1]} < rollout.context_tokens {cfg.rollout.context_tokens}: a full-context "
         "datum would not fit")
    need(b.token_budget >= b.buckets[-1], "batch.token_budget",
         f"{b.token_budget} < the largest bucket {b.buckets[-1]}")
    need(b.advantage_clip is None or b.advantage_clip > 0, "batch.advantage_clip", "must be positive or null")

    for key, ts in (("env.task_set", cfg.env.task_set), ("eval.task_set", cfg.eval.task_set)):
        err = env.get("task_set_error")(ts, check_paths)  # the environment's task sets (and files)
        need(err is None, key, str(err))
    # Test-time selection runs in both environments (docs/design/README.md, departure 4; the reference allows only
    # TextWorld).
    need(cfg.env.rules == "reference" or "env.rules" in env.options, "env.rules",
         "world rules apply to textworld_sync only")
    needs_labels = method.execution_reward == "rao" or method.uses("rubric_generation")
    check_roles(cfg, programmatic_env=env.programmatic)
    need(env.programmatic or not needs_labels or backend(cfg, "judge") is not None, "judge.kind",
         f"{method.name} on {env.name} needs sub-agent labels from a judge (openai or policy_frozen)")
    need(method.ranking_objective != "order_discrimination" or "order_discrimination" in env.options,
         "method.ranking_objective", f"order_discrimination is a TextCraft ablation (Rank+Disc): the reference "
         f"refuses it for {env.name}, so no paper method exists to reproduce")
    need(cfg.judge.kind != "openai" or bool(cfg.judge.endpoint or cfg.judge.endpoint_env), "judge.endpoint",
         "an openai judge needs endpoint or endpoint_env")
    check_trained_tokens(cfg, method)
    check_mesh(cfg, num_devices, model_cfg=model_cfg)


def check_trained_tokens(cfg: RunConfig, method=None) -> None:
    """The training guard: only tokens the trainable policy produced become datums. Raises ConfigError (one line)
    when a training recipe would train on tokens it did not produce: the rubric-generation stage trains the rubric
    writer's tokens, so its writer must be the policy; returns None. (Agent turns are the actor's: a served actor is
    refused by ``check_trainable_actor`` when a run is built for training, since sera-eval may serve one.)"""
    method = method or cfg.method_config()
    writer = backend(cfg, "rubric_writer")
    if method.uses("rubric_generation") and writer != "policy":
        raise ConfigError(f"roles.rubric_writer.backend: {writer!r} writes rubrics the trainable policy did not, but "
                          f"{method.name}'s schedule {method.stage_schedule} trains the rubric writer's tokens "
                          "(rubric_generation); write roles.rubric_writer.backend: policy, or a schedule without "
                          "rubric_generation (method.name: sera_wo_d_rt)")


def check_trainable_actor(cfg: RunConfig) -> None:
    """Raises ConfigError when the actor, whose every turn a training step trains, is not the trainable policy."""
    actor = backend(cfg, "actor")
    if actor != "policy":
        raise ConfigError(f"roles.actor.backend: {actor!r} cannot be trained (its turns are not the trainable "
                          "policy's tokens); write roles.actor.backend: policy, or evaluate it with sera-eval")


@functools.lru_cache(maxsize=8)
def _param_shapes(model_cfg: Qwen3Config):
    return abstract_params(model_cfg), param_logical_axes(model_cfg)


def check_mesh(cfg: RunConfig, num_devices: int | None = None, *, model_cfg: Qwen3Config | None = None) -> None:
    """Raises ConfigError naming the mesh key and every model dimension the configured mesh does not divide.

    With ``num_devices`` the mesh is resolved exactly (a ``-1`` axis takes what is left); without, ``-1`` axes are
    left out of the divisibility check (they are checked again once the device count is known). Returns None.
    """
    from jax.sharding import AbstractMesh

    mc = cfg.mesh
    model_cfg = model_cfg or cfg.model_config()
    sizes = (mc.data, mc.fsdp, mc.tensor)
    if any(s == 0 or s < -1 for s in sizes) or mc.dcn_data < 1:
        raise ConfigError(f"mesh: sizes must be positive (one of data/fsdp/tensor may be -1), got "
                          f"data={mc.data} fsdp={mc.fsdp} tensor={mc.tensor} dcn_data={mc.dcn_data}")
    if num_devices is not None:
        try:
            sizes = mc.resolve(num_devices)
        except ValueError as e:
            raise ConfigError(f"mesh: {e}") from None
    elif sizes.count(-1) > 1:
        raise ConfigError(f"mesh: at most one of data/fsdp/tensor may be -1, got {sizes}")
    elif sizes[0] != -1 and sizes[0] % mc.dcn_data:
        raise ConfigError(f"mesh.data: {sizes[0]} must be a multiple of mesh.dcn_data={mc.dcn_data} (hosts)")
    shapes, logical = _param_shapes(model_cfg)
    names = ("data", "fsdp", "tensor")

    def problem(axis_sizes) -> str | None:
        abstract = AbstractMesh(tuple(max(s, 1) for s in axis_sizes), names)
        for rules in (TRAIN_RULES, SAMPLE_RULES):
            try:
                check_divisible(shapes, logical, abstract, rules)
            except ValueError as e:
                return str(e)
        return None

    # Name the axis at fault: try each axis on its own first, then all together.
    for i, axis in enumerate(names):
        if sizes[i] > 1:
            msg = problem(tuple(s if j == i else 1 for j, s in enumerate(sizes)))
            if msg:
                raise ConfigError(f"mesh.{axis}: size {sizes[i]} does not divide model dimensions; {msg}")
    msg = problem(sizes)
    if msg:
        raise ConfigError(f"mesh: data={sizes[0]} fsdp={sizes[1]} tensor={sizes[2]} does not divide model "
                          f"dimensions; {msg}")
