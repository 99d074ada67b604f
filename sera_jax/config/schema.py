"""The run configuration's schema: typed frozen dataclasses, one per section, and ``RunConfig``.

Loading (YAML, ``base:`` files, ``a.b=c`` overrides) is ``config/load.py``; cross-field checks ``config/validate.py``.
Usage (what ``training/build.py`` and ``sera_jax.assembly`` do)::

    # e.g. argv = configs/tiny_cpu.yaml optim.lr=1e-5 train.total_steps=3; check_paths: model.hf_dir must exist
    cfg = load_config(*split_cli(sys.argv[1:]), check_paths=True)
    model_cfg = cfg.model_config()          # Qwen3Config (preset or HF config.json + overrides)
    method = cfg.method_config()            # rl.stages.MethodConfig (paper method + schedule overrides)
    tx = make_optimizer(cfg.optim)          # cfg.optim is an rl.optim.OptimConfig; cfg.step an rl.losses.StepConfig
    mesh = make_mesh(cfg.mesh)              # cfg.mesh is a parallel.MeshConfig
    check_mesh(cfg, jax.device_count())     # after initialize_distributed, when the mesh holds a -1

A YAML file may name ``base: other.yaml`` (relative to itself); the file's keys then update the base's, section by
section. Every error (unknown key, wrong type, bad enum value, inconsistent values, a mesh that does not divide a
model dimension) is a ``ConfigError`` whose message starts with the full key, e.g. ``optim.lr: expected float,
got 'abc'``. Validation traces shapes only (``jax.eval_shape``); it allocates and computes nothing.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from typing import Any, Literal, Optional

from sera_jax.agents.env_name import DEFAULT_ENV, EnvName
from sera_jax.agents.environments import environment
from sera_jax.model import Qwen3Config
from sera_jax.parallel.mesh import MeshConfig
from sera_jax.rl.batch import DEFAULT_BUCKETS
from sera_jax.rl.losses import StepConfig
from sera_jax.rl.optim import OptimConfig
from sera_jax.rl.stages import MethodConfig, method_config

__all__ = ["ConfigError", "ModelSection", "MethodSection", "EnvSection", "RolloutSection", "EngineSection", "BatchSection",
           "TrainSection", "JudgeSection", "EndpointSection", "EvalSection", "WarmStartSection", "RoleSection",
           "RolesSection", "ROLES", "BACKENDS", "RunConfig"]


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
    # Initial weights from a run directory's newest checkpoint (e.g. the warm start, ``sera-warmstart``); null =
    # hf_dir or random init. Ignored when the run directory already has checkpoints (the run resumes instead).
    init_from: Optional[str] = None


@dataclasses.dataclass(frozen=True)
class MethodSection:
    name: str = "sera"                                # a METHODS label ("SERA w/o D") or slug ("sera_wo_d")
    stage_schedule: Optional[str] = None              # null = the method's (docs/design/algorithm.md §8)
    ranking_objective: Optional[Literal["hinge", "order_discrimination"]] = None
    max_head_offpolicyness: Optional[int] = None
    # Execution-stage rejection of all-equal task groups (§5.6); null = the environment's (TC true, TW false).
    execution_filter_zero_variance_groups: Optional[bool] = None
    # Delegation-stage rejection of all-equal task groups (leaf_credit filter); null = the environment's (TC true,
    # TW false: docs/design/recipes.md §1b).
    delegation_filter_zero_variance_groups: Optional[bool] = None
    # Completion caps of the rubric-writing and execution-stage scoring calls; null = the method's (1024 each).
    max_rubric_tokens: Optional[int] = None
    max_scoring_tokens: Optional[int] = None
    # Completion cap of the rubric-generation stage's scoring calls; null = the method's (1024; TW recipes 512).
    rubric_stage_max_scoring_tokens: Optional[int] = None
    ranking_margin: Optional[float] = None            # the hinge margin; null = the method's (0.2)
    # Counterfactual branches per delegation point and environments per root rollout; null = the method's (8, 16).
    branching_factor: Optional[int] = None
    max_counterfactual_envs_per_rollout: Optional[int] = None
    # Sampling temperature of the rubric-writing call; null = the method's (1.0, docs/design/algorithm.md §3.5). Scoring stays greedy.
    rubric_temperature: Optional[float] = None
    # Reject rubric-generation task groups without a ranked fork group (see rl.stages.MethodConfig); null = false.
    rubric_filter_unranked_groups: Optional[bool] = None
    # The rubric reward's LOO baseline over one task's ranked fork groups or the step's (see
    # rl.stages.MethodConfig); null = "task" (the paper).
    rubric_baseline_scope: Optional[Literal["task", "step"]] = None
    # A control, not in the paper: -1 flips the sign of the rubric-generation stage's advantages only (the other
    # stages learn as usual), so the rubric objective is pushed the wrong way; null = 1.
    rubric_advantage_sign: Optional[float] = None


@dataclasses.dataclass(frozen=True)
class EnvSection:
    name: EnvName = DEFAULT_ENV           # a registered environment (agents.environments; checked by validate)
    task_set: str = "train"              # TC: train | val | path; TW: train | test | validation | path
    difficulties: tuple[str, ...] = ()   # () = all difficulties of the task set
    max_steps: int = 20                  # own steps per agent (root and each sub-agent)
    max_depth: int = 3                   # deepest sub-agent depth (root = 0)
    rules: Literal["reference", "full"] = "reference"  # TextWorld world rules
    num_workers: int = 4                 # env worker processes per host
    # Prompt texts: "paper" (the spec's) or "compact" (TextCraft: the same game, tools and rubric/score protocol
    # in a few lines, for the tiny CPU default).
    prompt_style: Literal["paper", "compact"] = "paper"
    # An agent's next prompt = its last prompt + the sampled completion tokens + the new messages' encoding, instead
    # of re-encoding the conversation (the reference). See agents/truncation.py: continue_prompt.
    token_history: bool = False


@dataclasses.dataclass(frozen=True)
class RolloutSection:
    tasks_per_step: int = 8              # accepted task groups per optimizer step = admission ranks (recipes §2)
    trees_per_task: int = 8              # root rollouts per task group (G)
    # The reference's rollout.max_concurrent_rollouts: each rank may run max(1, ⌊x / tasks_per_step⌋) groups, a
    # cap that binds only when method.max_head_offpolicyness > 0 (docs/design/recipes.md §2.2); null = tasks_per_step.
    max_concurrent_rollouts: Optional[int] = None
    # Extra groups per rank started ahead of the quota and consumed in start order (training/admission.py): not in
    # the reference; a speed setting that changes when a group runs, not which groups are trained.
    speculative_groups_per_rank: int = 0
    temperature: float = 1.0
    # Agents' temperature in the rubric-generation stage's trees; null = ``temperature``. Its fork branches replay
    # one sub-task: below temperature 1 a sharpened policy's branches nearly always agree, and a fork group whose
    # branches all succeed (or all fail) has nothing to rank.
    rubric_stage_temperature: Optional[float] = None
    # Accepted task groups per rubric-generation step; null = ``tasks_per_step``. Not in the paper: a saving for
    # a policy whose fork groups are seldom ranked (each rubric-stage group costs branching_factor × the trees).
    rubric_stage_tasks_per_step: Optional[int] = None
    top_p: float = 1.0
    max_completion_tokens: int = 512     # TC 512 / TW 3072
    max_prompt_tokens: int = 9600        # TC 9600 / TW 10240 (truncation threshold, §1.3)
    context_tokens: int = 10240          # serving context: TC 10240 / TW 13312
    # Sampling engines per host, one per local device from the first (each its own bf16 weights, KV pool and
    # decode loop; a task group's trees share one engine); null = every local GPU, 1 on CPU.
    engines: Optional[int] = None


@dataclasses.dataclass(frozen=True)
class EngineSection:
    # "device": the engines run the policy on this host's accelerators. "simulated" (never the default): the real
    # host path over a simulated device (sampling/simulated_engine.py) whose programs take the roofline time of
    # their shapes on ``simulate``'s GPU and emit the environment's oracle's tokens; every output says "simulated".
    backend: Literal["device", "simulated"] = "device"
    simulate: str = "h200"               # the simulated GPU (profiling/targets.py: h200, h100)
    simulated_gpus: int = 8              # simulated engines per process when rollout.engines is null


@dataclasses.dataclass(frozen=True)
class BatchSection:
    token_budget: int = 60_000           # tokens per micro-batch per device (the reference: per FSDP rank)
    buckets: tuple[int, ...] = DEFAULT_BUCKETS
    advantage_clip: Optional[float] = 20.0


@dataclasses.dataclass(frozen=True)
class TrainSection:
    total_steps: int = 250               # TC 250 / TW 400
    seed: int = 353                      # 353 multi-stage recipes, 343 RAO / RAO+D / SERA w/o D & RT
    checkpoint_every: int = 50
    keep_checkpoints: int = 3
    out_dir: str = "runs/default"
    deterministic_scheduling: bool = False  # the update never overlaps rollouts (resume gives the same next step)
    # The training task order: its seed (null = seed) and whether each pass reshuffles. The reference's sampler
    # uses seed 0 and never reshuffles, so every recipe and seed sees one order (docs/design/recipes.md §1c).
    data_seed: Optional[int] = None
    reshuffle_each_epoch: bool = True
    max_epochs: int = 10                 # safety bound over the task set
    # Compile before the first step every engine shape, the publish and the train step at each bucket for these
    # micro-batch counts, so that no step waits on a trace or a compilation (empty: compile on first use). A step's
    # micro-batches are padded to the smallest of them that holds them (beyond: the next power of two).
    warmup_micro_batches: tuple[int, ...] = (1, 2, 3, 4)
    warmup: bool = True
    # A newest checkpoint that cannot be read (torn): resume from the newest intact one, saying so (false: refuse;
    # sera-train/sera-eval --no-fallback).
    checkpoint_fallback: bool = True


@dataclasses.dataclass(frozen=True)
class JudgeSection:
    kind: Literal["programmatic", "openai", "policy_frozen"] = "programmatic"
    endpoint: Optional[str] = None       # OpenAI-compatible base URL (kind = openai)
    endpoint_env: str = "SERA_JUDGE_ENDPOINT"  # read at run time when endpoint is null
    model: Optional[str] = None
    temperature: float = 1.0
    max_tokens: int = 1024
    retries: int = 2                     # the rubric-stage judge's retries; the execution judge makes one attempt
    concurrency: int = 16                # judge requests in flight (per task group)
    timeout_s: float = 1800.0            # per request


@dataclasses.dataclass(frozen=True)
class EndpointSection:
    # A policy behind an OpenAI-compatible server (sera-eval --endpoint URL --model NAME): its replicas (requests go
    # round-robin), the served model's name, and how the client asks (sampling/endpoint.py). Empty urls: in process.
    urls: tuple[str, ...] = ()
    model: Optional[str] = None
    api_key_env: str = "SERA_ENDPOINT_API_KEY"  # the key is read from this variable, never from a command line
    # The served model's tokenizer (prompt budgets are counted in its tokens): a tokenizer.json / .model path or an
    # HF directory; null = asked of the server (sera-serve sends its own), else the run is refused.
    tokenizer: Optional[str] = None
    concurrency: int = 64                # requests in flight, over all replicas
    timeout_s: float = 600.0             # per request, whole
    retries: int = 2                     # per turn, after back-off, each to the next replica
    backoff_s: float = 1.0


# The model's roles and the backends that can play them (docs/design/roles.md; config/roles.py resolves them).
ROLES = ("actor", "rubric_writer", "scorer", "judge", "selector")
BACKENDS = ("policy", "frozen", "endpoint", "file")


@dataclasses.dataclass(frozen=True)
class RoleSection:
    # Who plays the role: "policy" (the trainable policy, in process), "frozen" (a frozen copy of the starting
    # policy, in process), "endpoint" (an OpenAI-compatible server, through the one HTTP client and the
    # EndpointPolicy interface), "file" (rubric_writer only: a fixed rubric); null = the role's default (the
    # reference's: the policy; for the judge, judge.kind).
    backend: Optional[Literal["policy", "frozen", "endpoint", "file"]] = None
    endpoint: Optional[str] = None       # base URL (backend endpoint); null = $SERA_EXTERNAL_ENDPOINT at run time
    model: Optional[str] = None          # the served model's name; null = $SERA_EXTERNAL_MODEL at run time
    api_key_env: str = "SERA_EXTERNAL_API_KEY"  # the key is read from this variable, never from the config
    # The served model's tokenizer (prompt budgets are counted in it): a path; null = the server's own (sera-serve
    # sends it), else the run's tokenizer.
    tokenizer: Optional[str] = None
    concurrency: int = 16                # requests in flight (the reference's rubric_subagent_reward.max_concurrency)
    timeout_s: float = 1800.0            # per request, whole (the reference's timeout_seconds)
    retries: int = 4                     # after the first attempt: the reference's external client makes 5 attempts
    backoff_s: float = 1.0               # before retry k: backoff_s × 2^(k-1), at most 30 s (the reference's)
    path: Optional[str] = None           # backend file: a rubric JSON; null = the environment's shipped global rubric
    # Requests turn the model's thinking off as the reference's external client does (its extra_body
    # reasoning_effort "none"); servers that do not know the field ignore it (sera-serve does).
    thinking_off: bool = True


@dataclasses.dataclass(frozen=True)
class RolesSection:
    actor: RoleSection = RoleSection()
    rubric_writer: RoleSection = RoleSection()
    scorer: RoleSection = RoleSection()
    judge: RoleSection = RoleSection()
    selector: RoleSection = RoleSection()


@dataclasses.dataclass(frozen=True)
class EvalSection:
    task_set: str = "val"
    difficulties: tuple[str, ...] = ()   # () = all difficulties of the eval task set
    num_tasks: Optional[int] = None      # null = every task of the set (else round-robin over difficulties)
    temperature: float = 0.0
    max_steps: int = 20
    max_completion_tokens: int = 512
    max_prompt_tokens: int = 9728        # TC eval 9728 / TW 10240
    context_tokens: int = 10240          # TC 10240 / TW 13312
    concurrency: int = 64
    retries: int = 1
    num_runs: int = 3                    # independent passes over the task set (docs/design/recipes.md §4: three)
    every: int = 0                       # evaluate every N optimizer steps during training (0 = never)
    best_of_n: int = 1                   # test-time selection (N = 2 in the paper's TextWorld runs; both envs here)
    fork_budget: int = 32
    # The rubric probe (evaluation/rubric_probe.py): with > 0, the default run also measures the policy's rubrics on
    # this many fixed held-out fork groups with both outcomes, before and after training (0 = off).
    rubric_probe_groups: int = 0
    rubric_probe_samples: int = 4        # rubrics written per group (each from its own key)
    rubric_probe_set: Optional[str] = None  # the set's JSONL (null = <out_dir>/rubric_probe_set.jsonl); collected
    #                                      by the starting policy when missing, then shared
    rubric_probe_seed: int = 0           # which tasks and keys collect the set (not train.seed: seeds share it)


@dataclasses.dataclass(frozen=True)
class WarmStartSection:
    # Supervised warm start on oracle demonstrations (``sera-warmstart``; TextCraft). With ``enabled``, sera-train
    # builds it first when model.init_from holds no checkpoint yet.
    enabled: bool = False
    out_dir: str = "runs/warmstart"
    demo_tasks: int = 400                # tasks the oracle plays (sampled from env.task_set / env.difficulties)
    # Where the demo tasks come from when not the RL tasks (null = env.task_set / env.difficulties): RL can then
    # train where the warm start is weak (e.g. Medium) from a warm start of Easy demonstrations -- the same recipe,
    # so the shipped warm start still matches.
    demo_task_set: Optional[str] = None
    demo_difficulties: Optional[tuple[str, ...]] = None
    # Likewise the agents' step limit the demos are played under (null = env.max_steps): RL can then train under a
    # tighter budget than the warm start's demonstrations had.
    demo_max_steps: Optional[int] = None
    steps: int = 100                     # SFT updates: the fixed, deliberately partial budget
    token_budget: int = 8192             # tokens per SFT update
    lr: float = 1.0e-3
    warmup_steps: int = 10
    delegate_prob: float = 0.7           # the oracle delegates a craftable ingredient with this probability
    fail_prob: float = 0.25              # ... and sabotages a sub-agent with this one (failures for the scorer)
    exhaust_share: float = 0.0           # of the sabotaged sub-agents, those that run out of steps instead
    #                                      (0 in the tiny default: a warm start built with 0.5 acted far worse)
    # TextWorld: how the oracle's sub-agents act. "greedy": the valid list's last progress action, whoever's dish it
    # serves (the shipped warm start's rule); "own_goal": the last progress action on its own goal's ingredients or
    # dishes, else a walk -- two children on one world then never take the same action (docs/results/textworld.md).
    child_rule: Literal["greedy", "own_goal"] = "greedy"
    # How often the oracle's demo rubric names the delegated goal; otherwise a distractor item, and its demo scores
    # judge the child against what the rubric names (oracle.py): < 1 makes the warm start's rubrics imperfect.
    rubric_target_prob: float = 1.0
    # What a missed demo rubric is: "distractor" (another item; scored against it, a child gets 0) or "vague" (no
    # target; every child scored against it gets 0.5).
    # "generic": the vague rubric in the target rubric's template ("its goal" for the item; oracle.py).
    rubric_miss: Literal["distractor", "vague", "generic"] = "distractor"
    copy_demos: int = 2000               # extra first-turn datums (the goal-copying turn), see goal_copy_datums
    # TextWorld: the task set the first-turn datums are drawn from (null = the demo tasks). A set of thousands of
    # goals, disjoint from the evaluation's, teaches copying a goal instead of recalling 200 of them.
    copy_task_set: Optional[str] = None
    fork_demo_tasks: int = 0             # of the demo tasks, played under the rubric-generation stage's launcher
    #                                      (fork groups): its post-hoc rubric prompt shows the parent's whole reply
    # How an update's datums are chosen: "mixed" (a shuffled stream cut at token_budget: any length with any, so
    # nearly every update pads to the longest bucket) or "by_length" (each update from one bucket, packed into one
    # micro-batch of its rows: the same tokens at about half the cost on 2 cores).
    batching: Literal["mixed", "by_length"] = "mixed"
    decay: bool = False                  # the rate decays linearly to 0 over the updates after warm-up
    seed: int = 0                        # demo tasks, oracle choices, batch order
    init_seed: int = 0                   # the random initialisation (not train.seed: RL seeds share one warm start)


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
    engine: EngineSection = EngineSection()
    batch: BatchSection = BatchSection()
    train: TrainSection = TrainSection()
    judge: JudgeSection = JudgeSection()
    eval: EvalSection = EvalSection()
    endpoint: EndpointSection = EndpointSection()
    warmstart: WarmStartSection = WarmStartSection()
    roles: RolesSection = RolesSection()

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
        over = {k: getattr(s, k) for k in ("stage_schedule", "ranking_objective", "max_head_offpolicyness",
                                           "max_rubric_tokens", "max_scoring_tokens", "branching_factor",
                                           "max_counterfactual_envs_per_rollout", "rubric_temperature",
                                           "rubric_filter_unranked_groups", "rubric_baseline_scope",
                                           "rubric_stage_max_scoring_tokens", "ranking_margin",
                                           "rubric_advantage_sign")
                if getattr(s, k) is not None}
        flag = s.delegation_filter_zero_variance_groups
        over["delegation_filter_zero_variance_groups"] = (environment(self.env.name).filter_zero_variance
                                                          if flag is None else flag)
        over["seed"] = self.train.seed
        over["concurrent_rollouts"] = self.max_concurrent_rollouts()
        over["cispo_ratio_min"], over["cispo_ratio_max"] = self.step.ratio_min, self.step.ratio_max
        return dataclasses.replace(base, **over)

    def max_concurrent_rollouts(self) -> int:
        """Returns rollout.max_concurrent_rollouts, or its reference default (the train batch: tasks_per_step)."""
        x = self.rollout.max_concurrent_rollouts
        return self.rollout.tasks_per_step if x is None else x

    def execution_filter_zero_variance(self) -> bool:
        """Returns whether the execution stage rejects task groups whose datum advantages are all equal (§5.6, §11)."""
        flag = self.method.execution_filter_zero_variance_groups
        return environment(self.env.name).filter_zero_variance if flag is None else flag

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
