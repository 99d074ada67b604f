"""The run configuration: typed frozen dataclasses, loaded from YAML plus ``a.b=c`` overrides, validated up front.

Usage (what ``train.py`` does)::

    # e.g. argv = configs/tiny_cpu.yaml optim.lr=1e-5 train.total_steps=3; check_paths: model.hf_dir must exist
    cfg = load_config(*split_cli(sys.argv[1:]), check_paths=True)
    model_cfg = cfg.model_config()          # Qwen3Config (preset or HF config.json + overrides)
    method = cfg.method_config()            # rl.stages.MethodConfig (paper method + schedule overrides)
    tx = make_optimizer(cfg.optim)          # cfg.optim is an rl.optim.OptimConfig; cfg.step a trainer.StepConfig
    mesh = make_mesh(cfg.mesh)              # cfg.mesh is a parallel.MeshConfig
    check_mesh(cfg, jax.device_count())     # after initialize_distributed, when the mesh holds a -1

A YAML file may name ``base: other.yaml`` (relative to itself); the file's keys then update the base's, section by
section. Every error (unknown key, wrong type, bad enum value, inconsistent values, a mesh that does not divide a
model dimension) is a ``ConfigError`` whose message starts with the full key, e.g. ``optim.lr: expected float,
got 'abc'``. Validation traces shapes only (``jax.eval_shape``); it allocates and computes nothing.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
import types
import typing
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Literal, Optional

import yaml

from sera_jax.model import Qwen3Config
from sera_jax.parallel.mesh import MeshConfig
from sera_jax.rl.batch import DEFAULT_BUCKETS
from sera_jax.rl.optim import OptimConfig
from sera_jax.rl.stages import MethodConfig, method_config, parse_schedule
from sera_jax.trainer import StepConfig

__all__ = ["ConfigError", "ModelSection", "MethodSection", "EnvSection", "RolloutSection", "BatchSection",
           "TrainSection", "JudgeSection", "EvalSection", "RunConfig", "load_config", "from_dict", "parse_override",
           "split_cli", "validate", "check_mesh"]


class ConfigError(ValueError):
    """A configuration error; the message starts with the full key it concerns."""


@dataclasses.dataclass(frozen=True)
class ModelSection:
    # Architecture preset (Qwen3Config.preset); null = read the architecture from hf_dir/config.json.
    preset: Optional[str] = "qwen3-4b-instruct-2507"
    hf_dir: Optional[str] = None        # Hugging Face checkpoint to start from (null = random init from train.seed)
    # Tokenizer: a tokenizer.json / .model file or directory; null = hf_dir's; "builtin:textcraft" = the tiny
    # sentencepiece model trained on TextCraft prompts and tasks (built once into the run directory).
    tokenizer: Optional[str] = None
    dtype: Optional[Literal["float32", "bfloat16", "float16"]] = None        # compute dtype; null = preset's
    param_dtype: Optional[Literal["float32", "bfloat16", "float16"]] = None  # master weights; null = preset's
    remat: Optional[bool] = None
    logits_chunk: Optional[int] = None


@dataclasses.dataclass(frozen=True)
class MethodSection:
    name: str = "sera"                                # a METHODS label ("SERA w/o D") or slug ("sera_wo_d")
    stage_schedule: Optional[str] = None              # null = the method's (spec §8)
    ranking_objective: Optional[Literal["hinge", "order_discrimination"]] = None
    max_head_offpolicyness: Optional[int] = None
    # Execution-stage rejection of all-equal task groups (§5.6); null = the environment's (TC true, TW false).
    execution_filter_zero_variance_groups: Optional[bool] = None


@dataclasses.dataclass(frozen=True)
class EnvSection:
    name: Literal["textcraft", "textworld_sync"] = "textcraft"
    task_set: str = "train"              # TC: train | val | path; TW: train | test | validation | path
    difficulties: tuple[str, ...] = ()   # () = all difficulties of the task set
    max_steps: int = 20                  # own steps per agent (root and each sub-agent)
    max_depth: int = 3                   # deepest sub-agent depth (root = 0)
    rules: Literal["reference", "full"] = "reference"  # TextWorld world rules
    num_workers: int = 4                 # env worker processes per host


@dataclasses.dataclass(frozen=True)
class RolloutSection:
    tasks_per_step: int = 8              # accepted task groups per optimizer step
    trees_per_task: int = 8              # root rollouts per task group (G)
    groups_in_flight: int = 24           # concurrent task groups (spec §6.3 "concurrent rollouts")
    temperature: float = 1.0
    top_p: float = 1.0
    max_completion_tokens: int = 512     # TC 512 / TW 3072
    max_prompt_tokens: int = 9600        # TC 9600 / TW 10240 (truncation threshold, §1.3)
    context_tokens: int = 10240          # serving context: TC 10240 / TW 13312


@dataclasses.dataclass(frozen=True)
class BatchSection:
    token_budget: int = 60_000           # tokens per micro-batch
    buckets: tuple[int, ...] = DEFAULT_BUCKETS
    advantage_clip: Optional[float] = 20.0


@dataclasses.dataclass(frozen=True)
class TrainSection:
    total_steps: int = 250               # TC 250 / TW 400
    seed: int = 353                      # 353 multi-stage recipes, 343 RAO / RAO+D / SERA w/o D & RT
    checkpoint_every: int = 50
    keep_checkpoints: int = 3
    out_dir: str = "runs/default"
    deterministic_scheduling: bool = False  # replayable rollout order (resume gives the same next step)
    max_epochs: int = 10                 # safety bound over the task set


@dataclasses.dataclass(frozen=True)
class JudgeSection:
    kind: Literal["programmatic", "openai", "policy_frozen"] = "programmatic"
    endpoint: Optional[str] = None       # OpenAI-compatible base URL (kind = openai)
    endpoint_env: str = "SERA_JUDGE_ENDPOINT"  # read at run time when endpoint is null
    model: Optional[str] = None
    temperature: float = 1.0
    max_tokens: int = 1024
    retries: int = 2


@dataclasses.dataclass(frozen=True)
class EvalSection:
    task_set: str = "val"
    temperature: float = 0.0
    max_steps: int = 20
    max_completion_tokens: int = 512
    max_prompt_tokens: int = 9728        # TC eval 9728 / TW 10240
    context_tokens: int = 10240          # TC 10240 / TW 13312
    concurrency: int = 64
    retries: int = 1
    num_runs: int = 1
    every: int = 0                       # evaluate every N optimizer steps during training (0 = never)
    best_of_n: int = 1                   # test-time selection (N = 2 in the paper's TextWorld runs; both envs here)
    fork_budget: int = 32


@dataclasses.dataclass(frozen=True)
class RunConfig:
    name: str = "default"
    model: ModelSection = ModelSection()
    mesh: MeshConfig = MeshConfig()
    optim: OptimConfig = OptimConfig()
    step: StepConfig = StepConfig()
    method: MethodSection = MethodSection()
    env: EnvSection = EnvSection()
    rollout: RolloutSection = RolloutSection()
    batch: BatchSection = BatchSection()
    train: TrainSection = TrainSection()
    judge: JudgeSection = JudgeSection()
    eval: EvalSection = EvalSection()

    def model_config(self) -> Qwen3Config:
        """Returns the Qwen3Config: the preset (or ``hf_dir``'s config.json when preset is null) + overrides."""
        m = self.model
        over = {k: getattr(m, k) for k in ("dtype", "param_dtype", "remat", "logits_chunk")
                if getattr(m, k) is not None}
        if m.preset is not None:
            return Qwen3Config.preset(m.preset, **over)
        return Qwen3Config.from_hf_json(m.hf_dir, **over)

    def method_config(self) -> MethodConfig:
        """Returns the paper method's MethodConfig with this config's schedule/ranking/off-policyness overrides."""
        s = self.method
        base = method_config(s.name)
        over = {k: getattr(s, k) for k in ("stage_schedule", "ranking_objective", "max_head_offpolicyness")
                if getattr(s, k) is not None}
        over["seed"] = self.train.seed
        over["concurrent_rollouts"] = self.rollout.groups_in_flight
        over["cispo_ratio_min"], over["cispo_ratio_max"] = self.step.ratio_min, self.step.ratio_max
        return dataclasses.replace(base, **over)

    def execution_filter_zero_variance(self) -> bool:
        """Returns whether the execution stage rejects task groups whose datum scalars are all equal (§5.6, §11)."""
        flag = self.method.execution_filter_zero_variance_groups
        return self.env.name == "textcraft" if flag is None else flag

    def to_dict(self) -> dict[str, Any]:
        """Returns the config as plain JSON-able data (tuples as lists), loadable again by ``from_dict``."""
        return _plain(dataclasses.asdict(self))

    def config_hash(self) -> str:
        """Returns the sha256 hex digest of the canonical JSON of ``to_dict()`` (sorted keys, no whitespace)."""
        canon = json.dumps(self.to_dict(), sort_keys=True, separators=(",", ":"), ensure_ascii=True)
        return hashlib.sha256(canon.encode()).hexdigest()


def _plain(x):
    if isinstance(x, dict):
        return {k: _plain(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_plain(v) for v in x]
    return x


# ---------------------------------------------------------------------------------------------------------------
# Typed construction with coercion

_TRUE, _FALSE, _NULL = {"true", "yes", "on", "1"}, {"false", "no", "off", "0"}, {"null", "none", "~"}


def _coerce(value: Any, tp: Any, key: str) -> Any:
    """Returns ``value`` as type ``tp`` (strings from the command line are parsed), or raises ConfigError."""
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if origin in (typing.Union, types.UnionType):
        inner = [a for a in args if a is not type(None)]
        if value is None or (isinstance(value, str) and value.strip().lower() in _NULL):
            return None
        return _coerce(value, inner[0], key)
    if origin is Literal:
        if value not in args:
            raise ConfigError(f"{key}: expected one of {list(args)}, got {value!r}")
        return value
    if origin is tuple:
        if isinstance(value, str):
            value = [v for v in value.strip().strip("[]()").split(",") if v.strip()]
        if not isinstance(value, (list, tuple)):
            raise ConfigError(f"{key}: expected a list, got {value!r}")
        return tuple(_coerce(v.strip() if isinstance(v, str) else v, args[0], f"{key}[{i}]")
                     for i, v in enumerate(value))
    if dataclasses.is_dataclass(tp):
        return _build(tp, value, key)
    if tp is bool:
        if isinstance(value, bool):
            return value
        if isinstance(value, str) and value.strip().lower() in _TRUE | _FALSE:
            return value.strip().lower() in _TRUE
        raise ConfigError(f"{key}: expected bool, got {value!r}")
    if tp is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        if isinstance(value, str):
            try:
                return int(value.strip())
            except ValueError:
                pass
        raise ConfigError(f"{key}: expected int, got {value!r}")
    if tp is float:
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return float(value)
        if isinstance(value, str):  # YAML 1.1 reads "3e-6" (no dot) as a string
            try:
                return float(value.strip())
            except ValueError:
                pass
        raise ConfigError(f"{key}: expected float, got {value!r}")
    if tp is str:
        if isinstance(value, str):
            return value
        raise ConfigError(f"{key}: expected str, got {value!r}")
    raise TypeError(f"{key}: unsupported field type {tp!r}")


def _build(cls, data: Any, prefix: str):
    if isinstance(data, cls):
        return data
    if not isinstance(data, Mapping):
        raise ConfigError(f"{prefix or 'config'}: expected a mapping of {cls.__name__} fields, got {data!r}")
    hints = typing.get_type_hints(cls)
    names = [f.name for f in dataclasses.fields(cls)]
    kwargs = {}
    for k, v in data.items():
        key = f"{prefix}.{k}" if prefix else str(k)
        if k not in names:
            raise ConfigError(f"{key}: unknown key; allowed: {', '.join(names)}")
        kwargs[k] = _coerce(v, hints[k], key)
    try:
        return cls(**kwargs)
    except ConfigError:
        raise
    except ValueError as e:  # a section's own __post_init__ check
        msg = str(e)
        raise ConfigError(msg if prefix and msg.startswith(prefix + ".") else f"{prefix or 'config'}: {msg}") from e


def _merge(base: dict, top: Mapping) -> dict:
    out = dict(base)
    for k, v in top.items():
        out[k] = _merge(out[k], v) if isinstance(v, Mapping) and isinstance(out.get(k), Mapping) else v
    return out


def _read_yaml(path: Path, seen: tuple[Path, ...] = ()) -> dict:
    path = path.resolve()
    if path in seen:
        raise ConfigError(f"base: include cycle through {path}")
    if not path.is_file():
        raise ConfigError(f"base: no config file {path}" if seen else f"config: no file {path}")
    data = yaml.safe_load(path.read_text()) or {}
    if not isinstance(data, dict):
        raise ConfigError(f"config: {path} must hold a mapping, got {type(data).__name__}")
    base = data.pop("base", None)
    if base is None:
        return data
    bases = [base] if isinstance(base, str) else list(base)
    merged: dict = {}
    for b in bases:
        merged = _merge(merged, _read_yaml(path.parent / b, seen + (path,)))
    return _merge(merged, data)


def parse_override(text: str) -> tuple[list[str], str]:
    """Returns (key path, raw value string) of one ``a.b=c`` override; raises ConfigError when malformed."""
    key, sep, value = text.partition("=")
    key = key.strip()
    if not sep or not key or any(not p for p in key.split(".")):
        raise ConfigError(f"{key or text}: an override must look like section.field=value, got {text!r}")
    return key.split("."), value


def _apply_override(data: dict, path: list[str], value: str) -> dict:
    out = dict(data)
    node = out
    for p in path[:-1]:
        child = node.get(p)
        node[p] = dict(child) if isinstance(child, Mapping) else {}
        node = node[p]
    node[path[-1]] = value  # a raw string: coerced to the field's type by _build
    return out


def split_cli(args: Sequence[str]) -> tuple[list[str], list[str]]:
    """Returns (YAML paths, ``a.b=c`` overrides) of command-line words: a word holding '=' is an override."""
    paths = [a for a in args if "=" not in a]
    return paths, [a for a in args if "=" in a]


def from_dict(data: Mapping[str, Any], *, num_devices: int | None = None, check_paths: bool = False) -> RunConfig:
    """Returns the validated RunConfig of a nested mapping (unknown keys, types, enums and consistency checked)."""
    cfg = _build(RunConfig, data, "")
    validate(cfg, num_devices=num_devices, check_paths=check_paths)
    return cfg


def load_config(paths: str | Path | Sequence[str | Path] = (), overrides: Sequence[str] = (), *,
                num_devices: int | None = None, check_paths: bool = False) -> RunConfig:
    """Returns the validated RunConfig of YAML file(s) (later files update earlier ones) and ``a.b=c`` overrides.

    ``num_devices``: when given, the mesh must use exactly that many devices (``-1`` axes resolved). ``check_paths``:
    files the config names (``model.hf_dir``) must exist and match the preset's architecture.
    """
    if isinstance(paths, (str, Path)):
        paths = [paths]
    data: dict = {}
    for p in paths:
        data = _merge(data, _read_yaml(Path(p)))
    for text in overrides:
        data = _apply_override(data, *parse_override(text))
    return from_dict(data, num_devices=num_devices, check_paths=check_paths)


# ---------------------------------------------------------------------------------------------------------------
# Cross-field validation

def validate(cfg: RunConfig, *, num_devices: int | None = None, check_paths: bool = False) -> None:
    """Raises ConfigError (naming the key) for values that are well typed but wrong together; returns None."""
    def need(cond: bool, key: str, msg: str) -> None:
        if not cond:
            raise ConfigError(f"{key}: {msg}")

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

    from sera_jax.rl.losses import LOSSES
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
    try:
        method = cfg.method_config()
    except ValueError as e:
        raise ConfigError(f"method: {e}") from None
    need(cfg.method.max_head_offpolicyness is None or cfg.method.max_head_offpolicyness >= 0,
         "method.max_head_offpolicyness", "must be ≥ 0")

    for section in ("env", "rollout", "batch", "train", "eval", "judge"):
        for f in dataclasses.fields(getattr(cfg, section)):
            v = getattr(getattr(cfg, section), f.name)
            if isinstance(v, int) and not isinstance(v, bool) and f.name not in ("seed", "every", "retries"):
                need(v > 0, f"{section}.{f.name}", f"must be positive, got {v}")
            if isinstance(v, int) and not isinstance(v, bool) and f.name in ("every", "retries"):
                need(v >= 0, f"{section}.{f.name}", f"must be ≥ 0, got {v}")
    need(cfg.env.max_depth <= 8, "env.max_depth", f"at most 8, got {cfg.env.max_depth}")
    need(cfg.rollout.trees_per_task >= 2, "rollout.trees_per_task", "leave-one-out baselines need at least 2")
    need(cfg.rollout.groups_in_flight >= 1, "rollout.groups_in_flight", "must be ≥ 1")
    need(cfg.rollout.temperature >= 0, "rollout.temperature", "must be ≥ 0")
    need(cfg.eval.temperature >= 0, "eval.temperature", "must be ≥ 0")
    need(0 < cfg.rollout.top_p <= 1, "rollout.top_p", "must lie in (0, 1]")
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

    tw = cfg.env.name == "textworld_sync"
    sets = {"train", "test", "validation", "dev", "val", "valid", "sample"} if tw else {"train", "val"}
    for key, ts in (("env.task_set", cfg.env.task_set), ("eval.task_set", cfg.eval.task_set)):
        need(ts in sets or ts.endswith((".json", ".jsonl", ".json.gz", ".jsonl.gz")), key,
             f"expected one of {sorted(sets)} or a .json/.jsonl path, got {ts!r}")
        if check_paths and ts not in sets:
            need(Path(ts).is_file(), key, f"no task file {ts}")
    # Test-time selection runs in both environments (spec README point 4; the reference allows only TextWorld).
    need(cfg.env.rules == "reference" or tw, "env.rules", "world rules apply to textworld_sync only")
    needs_labels = method.execution_reward == "rao" or method.uses("rubric_generation")
    need(not (tw and needs_labels and cfg.judge.kind == "programmatic"), "judge.kind",
         f"{method.name} on textworld_sync needs sub-agent labels from a judge (openai or policy_frozen)")
    need(cfg.judge.kind != "openai" or bool(cfg.judge.endpoint or cfg.judge.endpoint_env), "judge.endpoint",
         "an openai judge needs endpoint or endpoint_env")
    check_mesh(cfg, num_devices, model_cfg=model_cfg)


@functools.lru_cache(maxsize=8)
def _param_shapes(model_cfg: Qwen3Config):
    from sera_jax.model import abstract_params, param_logical_axes

    return abstract_params(model_cfg), param_logical_axes(model_cfg)


def check_mesh(cfg: RunConfig, num_devices: int | None = None, *, model_cfg: Qwen3Config | None = None) -> None:
    """Raises ConfigError naming the mesh key and every model dimension the configured mesh does not divide.

    With ``num_devices`` the mesh is resolved exactly (a ``-1`` axis takes what is left); without, ``-1`` axes are
    left out of the divisibility check (they are checked again once the device count is known). Returns None.
    """
    from jax.sharding import AbstractMesh

    from sera_jax.parallel.rules import SAMPLE_RULES, TRAIN_RULES, check_divisible

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
