"""Run configs: every shipped YAML loads and carries the spec's values; errors name the full key, before compute."""

import json
from pathlib import Path

import pytest

from sera_jax.config import ConfigError, RunConfig, from_dict, load_config, split_cli
from sera_jax.model import Qwen3Config

ROOT = Path(__file__).resolve().parents[2]
CONFIGS = sorted((ROOT / "configs").rglob("*.yaml"))
PAPER = ROOT / "configs" / "paper"
SLUGS = ["sera", "sera_wo_d", "sera_wo_d_rt", "rao", "rao_d", "rao_rt", "rank_disc"]


@pytest.mark.parametrize("path", CONFIGS, ids=lambda p: str(p.relative_to(ROOT / "configs")))
def test_every_shipped_config_loads_and_round_trips(path):
    cfg = load_config(path)
    assert isinstance(cfg, RunConfig)
    again = from_dict(json.loads(json.dumps(cfg.to_dict())))
    assert again == cfg and again.config_hash() == cfg.config_hash()
    cfg.model_config(), cfg.method_config()


def test_command_line_words_split_into_files_and_overrides():
    paths, overrides = split_cli([str(ROOT / "configs" / "tiny_cpu.yaml"), "train.seed=7", "env.max_steps=3"])
    assert len(paths) == 1 and overrides == ["train.seed=7", "env.max_steps=3"]
    cfg = load_config(paths, overrides)
    assert (cfg.train.seed, cfg.env.max_steps, cfg.name) == (7, 3, "tiny_cpu")


def test_overrides_are_coerced_to_the_field_type():
    cfg = load_config(ROOT / "configs" / "tiny_cpu.yaml",
                      ["optim.lr=3e-6", "train.total_steps=7", "train.deterministic_scheduling=false",
                       "batch.buckets=256,2048", "judge.endpoint=null", "mesh.fsdp=4", "env.difficulties=[easy]",
                       "method.stage_schedule=execution:3,rubric_generation:1", "name=x=y"])
    assert cfg.optim.lr == 3e-6 and isinstance(cfg.optim.lr, float)
    assert cfg.train.total_steps == 7 and cfg.train.deterministic_scheduling is False
    assert cfg.batch.buckets == (256, 2048) and cfg.mesh.fsdp == 4 and cfg.env.difficulties == ("easy",)
    assert cfg.method_config().stage_schedule == "execution:3,rubric_generation:1" and cfg.name == "x=y"
    # the rubric writer's temperature: the method's 1.0 unless the config names one
    assert load_config(PAPER / "textcraft_sera.yaml").method_config().rubric_temperature == 1.0
    assert load_config(ROOT / "configs" / "tiny_cpu.yaml", ["method.rubric_temperature=0.5"]) \
        .method_config().rubric_temperature == 0.5
    # the rubric reward's baseline scope: the paper's per-task LOO unless the config pools it over the step
    assert load_config(PAPER / "textcraft_sera.yaml").method_config().rubric_baseline_scope == "task"
    assert load_config(ROOT / "configs" / "tiny_cpu.yaml", ["method.rubric_baseline_scope=task"]) \
        .method_config().rubric_baseline_scope == "task"
    assert cfg.config_hash() != load_config(ROOT / "configs" / "tiny_cpu.yaml").config_hash()


@pytest.mark.parametrize("override, message", [
    ("optim.lr=abc", "optim.lr: expected float, got 'abc'"),
    ("train.total_steps=2.5", "train.total_steps: expected int, got '2.5'"),
    ("train.deterministic_scheduling=maybe", "train.deterministic_scheduling: expected bool"),
    ("optim.learning_rate=1", "optim.learning_rate: unknown key"),
    ("trainer.steps=1", "trainer: unknown key"),
    ("env.name=minecraft", "env.name: expected one of ['textcraft', 'textworld_sync'], got 'minecraft'"),
    ("judge.kind=human", "judge.kind: expected one of"),
    ("model.dtype=int8", "model.dtype: expected one of"),
    ("method.name=ppo", "method.name: unknown method 'ppo'"),
    ("method.stage_schedule=execution:16,planning:2", "method.stage_schedule: bad schedule entry"),
    ("step.loss=dpo", "step.loss: expected one of ['cispo', 'pg']"),
    ("optim.b2=1.5", "optim.b1 / optim.b2 must lie in [0, 1)"),
    ("batch.buckets=256,x", "batch.buckets[1]: expected int, got 'x'"),
    ("batch.buckets=512,256,1024", "batch.buckets: must be strictly increasing"),
    ("rollout.max_prompt_tokens=2000", "rollout.context_tokens: 1024 < max_prompt_tokens 2000"),
    ("rollout.trees_per_task=0", "rollout.trees_per_task: must be positive"),
    ("eval.best_of_n=0", "eval.best_of_n: must be positive, got 0"),
    ("method.branching_factor=1", "method.branching_factor: must be ≥ 2"),
    ("method.max_counterfactual_envs_per_rollout=0", "method.max_counterfactual_envs_per_rollout: must be ≥ 1"),
    ("method.rubric_temperature=0", "method.rubric_temperature: must be positive"),
    ("method.rubric_baseline_scope=batch", "method.rubric_baseline_scope: expected one of ['task', 'step']"),
    ("rollout.rubric_stage_tasks_per_step=0", "rollout.rubric_stage_tasks_per_step: must be positive"),
    ("warmstart.exhaust_share=1.5", "warmstart.exhaust_share: must lie in [0, 1], got 1.5"),
    ("warmstart.child_rule=own_goal", "warmstart.child_rule: is TextWorld-Sync's"),
    ("warmstart.child_rule=helpful", "warmstart.child_rule: expected one of"),
    ("warmstart.fork_demo_tasks=500", "warmstart.fork_demo_tasks: must lie in [0, warmstart.demo_tasks = 200]"),
    ("model.preset=qwen-7b", "model.preset: unknown Qwen3 preset 'qwen-7b'"),
    ("mesh.fsdp=3", "mesh.fsdp: size 3 does not divide model dimensions"),
    ("mesh.tensor=3", "mesh.tensor: size 3 does not divide model dimensions"),
    ("optim.lr", "optim.lr: an override must look like section.field=value"),
])
def test_a_bad_value_fails_naming_the_full_key(override, message):
    with pytest.raises(ConfigError) as err:
        load_config(ROOT / "configs" / "tiny_cpu.yaml", [override])
    assert message in str(err.value)
    assert str(err.value).startswith(message.split(":")[0])


def test_a_mesh_not_dividing_the_4b_model_names_the_dimension():
    with pytest.raises(ConfigError) as err:
        load_config(PAPER / "textcraft_sera.yaml", ["mesh.data=1", "mesh.dcn_data=1", "mesh.fsdp=12"])
    assert "mesh.fsdp: size 12" in str(err.value) and "logical 'embed', size 2560" in str(err.value)
    with pytest.raises(ConfigError, match="(?s)mesh.tensor: size 5.*logical 'heads', size 32"):
        load_config(PAPER / "textcraft_sera.yaml", ["mesh.tensor=5"])
    # the configured sizes must also match the devices once their number is known
    with pytest.raises(ConfigError, match="mesh: .*16 devices, but 8 are available"):
        load_config(PAPER / "textcraft_sera.yaml", num_devices=8)
    assert load_config(PAPER / "textcraft_sera.yaml", num_devices=16).mesh.resolve(16) == (2, 8, 1)
    # a -1 axis is checked once the device count resolves it
    with pytest.raises(ConfigError, match="mesh.fsdp: size 3"):
        load_config(ROOT / "configs" / "tiny_cpu.yaml", num_devices=3)


def test_textworld_label_methods_need_a_judge():
    with pytest.raises(ConfigError, match="judge.kind: RAO on textworld_sync needs sub-agent labels"):
        load_config(PAPER / "textworld_rao.yaml", ["judge.kind=programmatic"])
    # SERA w/o D & RT uses the policy's own rubric scores only: no judge needed
    load_config(PAPER / "textworld_sera_wo_d_rt.yaml", ["judge.kind=programmatic"])


def test_base_includes_merge_by_section_and_yaml_types(tmp_path):
    (tmp_path / "a.yaml").write_text("name: a\noptim: {lr: 3e-6, clip_norm: 2}\nmodel: {preset: tiny}\n"
                                     "rollout: {max_prompt_tokens: 512, max_completion_tokens: 64, "
                                     "context_tokens: 1024}\nbatch: {buckets: [256, 1024], token_budget: 2048}\n")
    (tmp_path / "b.yaml").write_text("base: a.yaml\noptim: {lr: 1.0e-5}\n")
    cfg = load_config(tmp_path / "b.yaml")
    assert cfg.name == "a" and cfg.optim.lr == 1e-5 and cfg.optim.clip_norm == 2.0  # int → float
    assert load_config(tmp_path / "a.yaml").optim.lr == 3e-6  # YAML 1.1 reads "3e-6" as a string
    (tmp_path / "c.yaml").write_text("base: d.yaml\n")
    (tmp_path / "d.yaml").write_text("base: c.yaml\n")
    with pytest.raises(ConfigError, match="base: include cycle"):
        load_config(tmp_path / "c.yaml")
    (tmp_path / "e.yaml").write_text("optim: 3\n")
    with pytest.raises(ConfigError, match="optim: expected a mapping of OptimConfig fields"):
        load_config(tmp_path / "e.yaml")


def test_hf_dir_is_checked_against_the_preset(tmp_path):
    hf = tmp_path / "hf"
    hf.mkdir()
    tiny = Qwen3Config.preset("tiny")
    (hf / "config.json").write_text(json.dumps(tiny.to_hf_dict()))
    base = [f"model.hf_dir={hf}", "rollout.max_prompt_tokens=512", "rollout.context_tokens=1024",
            "rollout.max_completion_tokens=64", "batch.buckets=256,1024", "batch.token_budget=2048"]
    cfg = load_config([], base + ["model.preset=tiny"], check_paths=True)
    assert cfg.model_config() == tiny
    # preset null: the architecture comes from config.json
    assert load_config([], base + ["model.preset=null"], check_paths=True).model_config() == tiny.replace(
        logits_chunk=1024)  # not part of config.json
    with pytest.raises(ConfigError, match=r"model.hf_dir: config.json differs from preset 'qwen3-4b-instruct-2507'"):
        load_config([], [f"model.hf_dir={hf}"], check_paths=True)
    with pytest.raises(ConfigError, match="model.hf_dir: no config.json in"):
        load_config(PAPER / "textcraft_sera.yaml", [f"model.hf_dir={tmp_path / 'missing'}"], check_paths=True)


def test_config_hash_is_stable_and_canonical():
    a = load_config(PAPER / "textcraft_sera.yaml")
    b = from_dict(dict(reversed(list(a.to_dict().items()))))
    assert a.config_hash() == b.config_hash() and len(a.config_hash()) == 64
    assert a.config_hash() != load_config(PAPER / "textcraft_sera.yaml", ["train.seed=1"]).config_hash()


def test_rubric_stage_temperature_applies_to_that_stage_only():
    from sera_jax.assembly.settings import runtime_settings, stage_settings

    cfg = load_config(ROOT / "configs" / "tiny_cpu.yaml", ["rollout.temperature=0.7",
                                                           "rollout.rubric_stage_temperature=1.0"])
    base = runtime_settings(cfg)
    assert base.temperature == 0.7
    rubric, execution = (stage_settings(base, cfg, s, 3) for s in ("rubric_generation", "execution"))
    assert (rubric.temperature, rubric.policy_version) == (1.0, 3)
    assert (execution.temperature, execution.policy_version) == (0.7, 3)
    same = load_config(ROOT / "configs" / "tiny_cpu.yaml", ["rollout.temperature=0.7",
                                                            "rollout.rubric_stage_temperature=null"])
    assert stage_settings(runtime_settings(same), same, "rubric_generation", 0).temperature == 0.7
    with pytest.raises(ConfigError, match="rollout.rubric_stage_temperature: must be positive"):
        load_config(ROOT / "configs" / "tiny_cpu.yaml", ["rollout.rubric_stage_temperature=0"])
