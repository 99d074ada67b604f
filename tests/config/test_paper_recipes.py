"""Every configs/paper/*.yaml against docs/design/recipes.md §1a (TextCraft), §1b (TextWorld), §1c (shared) and §4 (evaluation):
one row of the table per method, each value the config can express checked here."""

from __future__ import annotations

import collections
import dataclasses
from pathlib import Path

import pytest

from sera_jax.assembly.concurrency import per_rank_concurrency
from sera_jax.config import ConfigError, load_config
from sera_jax.model import Qwen3Config
from sera_jax.rl.stages import METHODS, method_config, position

PAPER = Path(__file__).resolve().parents[2] / "configs" / "paper"

# method slug: (seed, max_concurrent_rollouts, max_head_offpolicyness, exec/deleg/rubric updates)   §1a
TEXTCRAFT = {
    "rao": (343, 8, 3, (250, 0, 0)),
    "rao_d": (343, 12, 0, (190, 60, 0)),
    "rao_rt": (353, 24, 0, (224, 0, 26)),
    "sera_wo_d_rt": (343, 8, 3, (250, 0, 0)),
    "sera_wo_d": (353, 24, 0, (224, 0, 26)),
    "sera": (353, 24, 0, (202, 24, 24)),
    "rank_disc": (353, 24, 0, (224, 0, 26)),
}
# §1b (every TextWorld recipe: max_head_offpolicyness 0)
TEXTWORLD = {
    "rao": (367, 32, 0, (400, 0, 0)),
    "rao_d": (367, 32, 0, (300, 100, 0)),
    "rao_rt": (362, 24, 0, (356, 0, 44)),
    "sera_wo_d_rt": (362, 32, 0, (400, 0, 0)),
    "sera_wo_d": (362, 24, 0, (356, 0, 44)),
    "sera": (362, 24, 0, (320, 40, 40)),
}
EXEC_REWARD = {"rao": "rao", "rao_d": "rao", "rao_rt": "rao", "sera_wo_d_rt": "rubric", "sera_wo_d": "rubric",
               "sera": "rubric", "rank_disc": "rubric"}
CASES = [("textcraft", m, row) for m, row in TEXTCRAFT.items()] + [("textworld", m, row) for m, row in TEXTWORLD.items()]


def _updates(schedule: str, total: int) -> tuple[int, int, int]:
    n = collections.Counter(position(v, schedule).stage for v in range(total))
    return n["execution"], n["delegation"], n["rubric_generation"]


@pytest.mark.parametrize("env,slug,row", CASES, ids=[f"{e}_{m}" for e, m, _ in CASES])
def test_method_rows(env, slug, row):
    seed, concurrent, ofp, updates = row
    cfg = load_config(PAPER / f"{env}_{slug}.yaml")
    method = cfg.method_config()
    tc = env == "textcraft"
    assert cfg.env.name == ("textcraft" if tc else "textworld_sync")
    assert method.name == method_config(slug).name and method.execution_reward == EXEC_REWARD[slug]
    assert cfg.train.seed == seed and method.seed == seed                                      # row seed
    assert cfg.train.total_steps == (250 if tc else 400)                                       # total_train_steps
    assert _updates(method.stage_schedule, cfg.train.total_steps) == updates                  # schedule, updates
    assert cfg.max_concurrent_rollouts() == concurrent                                         # max_concurrent
    assert per_rank_concurrency(concurrent, cfg.rollout.tasks_per_step) == max(1, concurrent // 8)
    assert method.max_head_offpolicyness == ofp                                                # staleness
    assert cfg.rollout.speculative_groups_per_rank == 0                                        # admission as §2
    # zero-variance handling: TC rejects (exec and delegation); TW keeps exec groups trainable, no deleg filter
    assert cfg.execution_filter_zero_variance() is tc
    assert method.delegation_filter_zero_variance_groups is tc
    assert (method.invalid_delegation_reward, method.launch_advantage_mode, method.launch_credit_mode,
            method.subagent_success_gate, method.workload_weight_cap) == (
        0.0, "reward_first_root_balanced", "leaf", False, 1.0)                                 # leaf_credit row
    if EXEC_REWARD[slug] == "rubric":                                                          # exec rubric row
        assert (method.rubric_temperature, method.scoring_temperature, method.max_rubric_tokens,
                method.max_scoring_tokens, method.min_rubric_criteria, method.failure_policy) == (
            1.0, 0.0, 1024, 1024, 2, "drop_trajectory")
    if method.uses("rubric_generation"):                                                       # RT rows
        assert (method.branching_factor, method.max_counterfactual_envs_per_rollout, method.ranking_margin) == (
            8, 16, 0.2)
        assert method.rubric_stage_max_scoring_tokens == (1024 if tc else 512)
        assert method.ranking_objective == ("order_discrimination" if slug == "rank_disc" else "hinge")
        assert (method.order_weight, method.disc_weight, method.discrimination_scale) == (0.5, 0.5, 2.0)
    # judge: none in TextCraft; the Kimi judge's settings in TextWorld
    j = cfg.judge
    if tc:
        assert j.kind == "programmatic"
    else:
        assert (j.kind, j.model, j.temperature, j.max_tokens, j.retries, j.concurrency, j.timeout_s) == (
            "openai", "kimi-k2.6", 1.0, 1024, 2, 16, 1800.0)


@pytest.mark.parametrize("env", ["textcraft", "textworld"])
def test_shared_rows(env):
    """§1c and §4, the same for every method of an environment."""
    tc = env == "textcraft"
    for path in sorted(PAPER.glob(f"{env}_*.yaml")):
        if path.stem.endswith(("_base", "_single_agent")):
            continue
        cfg = load_config(path)
        m = cfg.model_config()
        assert m == Qwen3Config.preset("qwen3-4b-instruct-2507")
        assert (m.dtype, m.param_dtype, m.remat) == ("bfloat16", "float32", True)           # bf16, grad ckpt
        assert cfg.mesh.resolve(16) == (2, 8, 1) and cfg.mesh.dcn_data == 2                 # 2 nodes × 8 GPUs
        o = cfg.optim
        assert (o.lr, o.weight_decay, o.b1, o.b2, o.eps, o.clip_norm, o.warmup_steps) == (
            3e-6, 0.017, 0.9, 0.95, 1e-8, 1.0, 1)
        assert (cfg.step.loss, cfg.step.ratio_min, cfg.step.ratio_max) == ("cispo", 0.0, 5.0)
        method = cfg.method_config()
        assert method.leave_one_out_baseline and method.depth_level_weighting
        assert method.depth_level_discount_gamma is None
        r = cfg.rollout
        assert (r.tasks_per_step, r.trees_per_task, r.temperature, r.top_p) == (8, 8, 1.0, 1.0)
        assert cfg.batch.token_budget == 60_000 and cfg.train.checkpoint_every == 50
        assert (cfg.env.max_steps, cfg.env.max_depth) == (20, 3)
        assert (r.context_tokens, r.max_prompt_tokens, r.max_completion_tokens) == (
            (10240, 9600, 512) if tc else (13312, 10240, 3072))
        # side-call prompt budget = agent prompt cap + agent completion cap − the call's own cap (§1c)
        side = r.max_prompt_tokens + r.max_completion_tokens
        assert side - method.max_rubric_tokens == (9088 if tc else 12288)
        assert side - method.rubric_stage_max_scoring_tokens == (9088 if tc else 12800)
        assert (cfg.train.data_seed, cfg.train.reshuffle_each_epoch) == (0, False)           # one task order
        assert cfg.env.task_set == "train"
        e = cfg.eval                                                                         # §4
        assert (e.temperature, e.num_runs, e.concurrency, e.retries, e.max_steps, e.best_of_n) == (0.0, 3, 64, 1, 20, 1)
        assert (e.task_set, e.context_tokens, e.max_prompt_tokens, e.max_completion_tokens) == (
            ("val", 10240, 9728, 512) if tc else ("test", 13312, 10240, 3072))


def test_every_paper_method_has_its_configs_and_nothing_else():
    names = {p.stem for p in PAPER.glob("*.yaml")}
    want = {f"textcraft_{m}" for m in TEXTCRAFT} | {f"textworld_{m}" for m in TEXTWORLD} | {
        "textcraft_base", "textworld_base", "textcraft_single_agent", "textworld_single_agent"} | {
        f"textcraft_{m}" for m in RUBRIC_ABLATIONS}
    assert names == want
    assert {method_config(s).name for s in TEXTCRAFT} == set(METHODS)


# The rubric-design ablations (Scripts/Ablation/textcraft/*.sh): (rubric writer, scorer) on SERA w/o D&RT.
RUBRIC_ABLATIONS = {"kimi_rubric_policy_scorer": ("endpoint", "policy"),
                    "kimi_rubric_kimi_scorer": ("endpoint", "endpoint"),
                    "global_rubric_policy_scorer": ("file", "policy")}


@pytest.mark.parametrize("slug", RUBRIC_ABLATIONS)
def test_rubric_ablation_rows(slug):
    """Each launcher's settings: SERA w/o D&RT's in every resolved value but the roles; the external model's client
    as the launcher sets it (kimi-k2.6, KIMI_API_KEY, 16 in flight, 1,800 s, 5 attempts, thinking off)."""
    from sera_jax.config.roles import backend

    cfg, base = load_config(PAPER / f"textcraft_{slug}.yaml"), load_config(PAPER / "textcraft_sera_wo_d_rt.yaml")
    assert cfg.method_config() == base.method_config()
    for section in ("model", "mesh", "optim", "step", "env", "rollout", "batch", "judge", "eval", "endpoint"):
        assert getattr(cfg, section) == getattr(base, section), section
    assert cfg.train == dataclasses.replace(base.train, out_dir=f"runs/textcraft_{slug}")
    assert (backend(cfg, "rubric_writer"), backend(cfg, "scorer")) == RUBRIC_ABLATIONS[slug]
    assert backend(cfg, "actor") == backend(cfg, "selector") == "policy" and backend(cfg, "judge") is None
    for role in ("rubric_writer", "scorer"):
        sec = getattr(cfg.roles, role)
        if backend(cfg, role) == "endpoint":
            assert (sec.endpoint, sec.model, sec.api_key_env, sec.concurrency, sec.timeout_s, sec.retries + 1,
                    sec.thinking_off) == (None, "kimi-k2.6", "KIMI_API_KEY", 16, 1800.0, 5, True)
    if slug.startswith("global"):
        assert cfg.roles.rubric_writer.path is None  # the shipped global rubric of the environment
    # Rubric training with an external or fixed writer would train tokens the policy did not write: refused.
    with pytest.raises(ConfigError, match=r"^roles\.rubric_writer\.backend: '(endpoint|file)' writes rubrics"):
        load_config(PAPER / f"textcraft_{slug}.yaml", ["method.name=sera_wo_d", "method.max_head_offpolicyness=0"])


@pytest.mark.parametrize("env", ["textcraft", "textworld"])
def test_single_agent_baselines_are_the_base_at_depth_0_with_200_root_steps(env):
    """The reference's run_single_agent.sh: no sub-agents, 200 root steps, the paper's evaluation otherwise."""
    cfg, base = load_config(PAPER / f"{env}_single_agent.yaml"), load_config(PAPER / f"{env}_base.yaml")
    assert (cfg.env.max_depth, cfg.eval.max_steps) == (0, 200)
    for k in ("task_set", "temperature", "num_runs", "retries", "max_prompt_tokens", "max_completion_tokens",
              "context_tokens", "best_of_n"):
        assert getattr(cfg.eval, k) == getattr(base.eval, k), k
    assert cfg.model_config() == base.model_config() and cfg.env.name == base.env.name
    tiny = load_config(PAPER.parent / "tiny_single_agent.yaml")
    assert (tiny.env.max_depth, tiny.eval.max_steps) == (0, 200)


def test_textworld_rank_disc_and_stale_multistage_are_refused():
    with pytest.raises(ConfigError, match="method.ranking_objective: order_discrimination is a TextCraft ablation"):
        load_config(PAPER / "textworld_base.yaml", ["method.name=rank_disc"])
    with pytest.raises(ConfigError, match="max_head_offpolicyness = 0"):
        load_config(PAPER / "textcraft_sera.yaml", ["method.max_head_offpolicyness=1"])
    with pytest.raises(ConfigError, match="rollout.groups_in_flight: removed"):
        load_config(PAPER / "textcraft_sera.yaml", ["rollout.groups_in_flight=4"])
