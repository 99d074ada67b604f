"""The training loop: stage ← kernel(version); trees ← rollouts; datums ← credit; state ← train_step; publish.

One policy version per optimizer step (spec §6.3, §7). For version v the stage kernel names the objective; up to
``rollout.groups_in_flight`` task groups (each ``rollout.trees_per_task`` root trees of one task) run concurrently
against the engine, and the first ``rollout.tasks_per_step`` *accepted* groups make the step (spec §5.6: rejected
groups are replaced by the next task). In deterministic mode groups run and are accepted strictly in data order,
so a resumed run reproduces the next step. A step with fewer trainable datums than data-parallel ranks, or with a
non-finite loss, is skipped: the version does not advance and the same stage is sampled again.

Everything the loop needs to continue is checkpointed with the state: version, skipped-step count, data order and
cursor, the PRNG key, the model config and provenance (``sera_jax.training.checkpoint``).

Step metrics (``metrics.jsonl`` and TensorBoard ``step/<name>``): tree scalars and supervision spent
(``sera_jax.training.stats``), advantages, the train step's own metrics, and wall time in seconds by phase:

* ``time/rollout_s`` — wall time collecting the step's task groups (rollouts, labels, rubric calls, credit);
* ``time/generation_s``, ``time/env_s``, ``time/scoring_s`` — wall time within the rollout during which at least one
  span of that phase was open (union of intervals, ≤ ``time/rollout_s``): generation = agent turns and rubric-writing
  calls awaiting the generator; env = environment actions (a TextCraft cell minus its sub-agent launches, a
  TextWorld command); scoring = rubric-scoring calls and judge requests. Phases overlap one another (many agents run
  at once), so they do not add up to the rollout time;
* ``time/generation_busy_s``, ``time/env_busy_s``, ``time/scoring_busy_s`` — the summed span durations
  (agent-seconds; above the wall time when agents overlap);
* ``time/rollout_uncovered_s`` — rollout wall time with no generation, env or scoring span open (host work);
* ``time/batch_s``, ``time/train_s``, ``time/publish_s`` — packing the batch, the train step (to its metrics on the
  host), publishing the weights to the sampler; ``time/step_s`` — the whole attempt.

Spans come from the runtime's trace (``sera_jax.agents.phases``): the loop activates a fresh one around each rollout.
"""

from __future__ import annotations

import asyncio
import dataclasses
import time
from pathlib import Path
from typing import Any, Callable, Sequence

import jax
import numpy as np

from sera_jax.agents.env_name import EnvName
from sera_jax.agents.phases import Trace, phase_times, tracing
from sera_jax.agents.records import write_jsonl
from sera_jax.interop.export import model_config_record
from sera_jax.rl.baselines import (
    GroupCredit,
    apply_depth_weights,
    step_is_skipped,
    step_rubric_credit,
    task_group_credit,
)
from sera_jax.rl.batch import pack_datums
from sera_jax.rl.stages import MethodConfig, position
from sera_jax.training.checkpoint import (
    Checkpointer,
    key_from_json,
    key_to_json,
    run_metadata,
)
from sera_jax.training.metrics import MetricsWriter
from sera_jax.training.stats import tree_metrics
from sera_jax.training.step import CompiledStep, TrainState, batch_axis_size, stack_micro_batches


@dataclasses.dataclass
class DataStream:
    """Task order over epochs: a seeded permutation per epoch, consumed by a cursor (both checkpointed)."""

    num_tasks: int
    seed: int
    epoch: int = 0
    cursor: int = 0
    order: list[int] = dataclasses.field(default_factory=list)

    def __post_init__(self) -> None:
        if self.num_tasks <= 0:
            raise ValueError("the task set is empty")
        if not self.order:
            self.order = self._permutation(self.epoch)

    def _permutation(self, epoch: int) -> list[int]:
        return np.random.default_rng([self.seed, epoch]).permutation(self.num_tasks).tolist()

    def next(self) -> int:
        """Returns the next task index, starting a freshly shuffled epoch when one is used up."""
        if self.cursor >= len(self.order):
            self.epoch += 1
            self.cursor = 0
            self.order = self._permutation(self.epoch)
        idx = self.order[self.cursor]
        self.cursor += 1
        return idx

    def to_json(self) -> dict[str, Any]:
        return {"num_tasks": self.num_tasks, "seed": self.seed, "epoch": self.epoch, "cursor": self.cursor,
                "order": self.order}

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> "DataStream":
        return cls(**d)


class NoTrainableData(RuntimeError):
    """Training cannot progress: too many consecutive steps were skipped for lack of trainable data."""


@dataclasses.dataclass
class StepOutcome:
    """What one attempt at policy version ``version`` produced."""

    version: int
    stage: str
    skipped: bool
    reason: str
    metrics: dict[str, Any]


GroupRunner = Callable[[Any, str, int], "asyncio.Future"]


async def collect_groups(stage: str, version: int, tasks: Sequence[Any], stream: DataStream,
                         run_group: Callable[[Any, str, int], Any], credit: Callable[[str, list], GroupCredit], *,
                         tasks_per_step: int, groups_in_flight: int, deterministic: bool,
                         max_attempts: int) -> tuple[list[GroupCredit], dict[str, Any]]:
    """Returns the accepted task groups of one step and collection statistics.

    ``run_group(task, stage, version)`` runs one task's trees; ``credit(stage, trees)`` judges and advantages them.
    At most ``max_attempts`` groups are tried (a bound on replacements, so an untrainable policy cannot loop
    forever); in deterministic mode groups are accepted in data order, otherwise in completion order.
    """
    accepted: list[GroupCredit] = []
    stats: dict[str, Any] = {"groups_started": 0, "groups_rejected": 0, "trees": 0, "tree_records": []}
    in_flight: dict[asyncio.Task, int] = {}
    window = tasks_per_step if deterministic else groups_in_flight

    def launch() -> None:
        idx = stream.next()
        stats["groups_started"] += 1
        in_flight[asyncio.ensure_future(run_group(tasks[idx], stage, version))] = stats["groups_started"]

    try:
        while len(accepted) < tasks_per_step:
            while len(in_flight) < window and stats["groups_started"] < max_attempts:
                launch()
            if not in_flight:
                break
            if deterministic:
                first = min(in_flight, key=in_flight.get)
                await first
                done = [first]
            else:
                done, _ = await asyncio.wait(list(in_flight), return_when=asyncio.FIRST_COMPLETED)
                done = sorted(done, key=in_flight.get)
            for fut in done:
                in_flight.pop(fut)
                trees = fut.result()
                stats["trees"] += len(trees)
                stats["tree_records"].extend(trees)
                group = credit(stage, trees)
                if group.accepted and len(accepted) < tasks_per_step:
                    accepted.append(group)
                else:
                    stats["groups_rejected"] += int(not group.accepted)
    finally:
        for fut in in_flight:
            fut.cancel()  # cancelling frees the engine blocks of their pending turns
        if in_flight:
            await asyncio.gather(*in_flight, return_exceptions=True)
    return accepted, stats


def build_batch(groups: Sequence[GroupCredit], method: MethodConfig, *, num_ranks: int, token_budget: int,
                buckets: Sequence[int], row_multiple: int):
    """Returns (stacked micro-batches or None, info): depth-weighted trainable datums packed for ``train_step``;
    None when the step must be skipped (fewer trainable datums than ``num_ranks``)."""
    datums = [d for g in groups for d in g.datums]
    trainable = [d for d in datums if d.trainable]
    info = {"datums": len(datums), "trainable_datums": len(trainable)}
    if step_is_skipped(len(trainable), num_ranks):
        return None, {**info, "reason": f"{len(trainable)} trainable datums < {num_ranks} ranks"}
    if method.depth_level_weighting:
        trainable = apply_depth_weights(trainable, gamma=method.depth_level_discount_gamma)
    packed = pack_datums(trainable, token_budget=token_budget, buckets=buckets)
    batch = stack_micro_batches(packed.micro_batches, row_multiple=row_multiple)
    info.update(micro_batches=len(packed.micro_batches), loss_tokens=packed.num_tokens,
                rows=int(batch.tokens.shape[1]), row_len=int(batch.tokens.shape[2]))
    return batch, info


@dataclasses.dataclass
class Loop:
    """The pieces one training run wires together (``training/build.py`` builds them from a config)."""

    state: TrainState
    step_fn: CompiledStep
    publish: Callable[[Any], int]                     # new params → sampler; returns the sampler's version
    run_group: Callable[[Any, str, int], Any]         # async: one task group's trees
    tasks: Sequence[Any]
    method: MethodConfig
    stream: DataStream
    env: EnvName
    decode: Callable[[list[int]], str]
    mesh: Any
    tasks_per_step: int = 8
    stage_tasks_per_step: dict[str, int] = dataclasses.field(default_factory=dict)  # per-stage overrides
    groups_in_flight: int = 24
    token_budget: int = 60_000
    buckets: Sequence[int] = (256, 512, 1024, 2048, 4096, 8192, 12288, 16384)
    deterministic: bool = False
    num_ranks: int | None = None
    filter_zero_variance: bool | None = None
    max_group_attempts: int | None = None
    version: int = 0
    skipped_steps: int = 0
    key: Any = None
    checkpointer: Checkpointer | None = None
    metrics: MetricsWriter | None = None
    meta: dict[str, Any] = dataclasses.field(default_factory=dict)
    trees_dir: str | Path | None = None               # every attempt's trees as JSONL (sera-view reads them)
    _t_start: float = dataclasses.field(default=0.0, init=False, repr=False)  # the current attempt's start

    def _ranks(self) -> int:
        return self.num_ranks if self.num_ranks is not None else (batch_axis_size(self.mesh) if self.mesh else 1)

    def _credit(self, stage: str, trees: list) -> GroupCredit:
        return task_group_credit(stage, trees, self.method, decode=self.decode, env=self.env,
                                 filter_zero_variance=self.filter_zero_variance if stage == "execution" else None)

    async def step(self) -> StepOutcome:
        """Runs one attempt at the current version; returns what happened (the version advances on success)."""
        pos = position(self.version, self.method.stage_schedule)
        tasks_per_step = self.stage_tasks_per_step.get(pos.stage, self.tasks_per_step)
        self._t_start = t0 = time.monotonic()
        trace = Trace()
        with tracing(trace):  # tasks started inside (every group, tree, side call) record into this trace
            groups, stats = await collect_groups(
                pos.stage, self.version, self.tasks, self.stream, self.run_group, self._credit,
                tasks_per_step=tasks_per_step, groups_in_flight=self.groups_in_flight,
                deterministic=self.deterministic,
                max_attempts=self.max_group_attempts or 4 * max(tasks_per_step, self.groups_in_flight))
        t_end = time.monotonic()
        trees = stats.pop("tree_records")
        if pos.stage == "rubric_generation" and self.method.rubric_baseline_scope == "step":
            groups = step_rubric_credit(groups)
        metrics: dict[str, Any] = {"stage": pos.stage, "groups_accepted": len(groups), **stats,
                                   "time/rollout_s": t_end - t0}
        phases = phase_times(trace, t0, t_end)
        metrics.update({f"time/{k}": v for k, v in phases.items() if k != "uncovered_s"})
        metrics["time/rollout_uncovered_s"] = phases["uncovered_s"]
        metrics.update(tree_metrics(trees, env=self.env))
        if self.trees_dir is not None:
            Path(self.trees_dir).mkdir(parents=True, exist_ok=True)
            write_jsonl(trees, Path(self.trees_dir) / f"v{self.version:06d}_{self.skipped_steps:04d}.jsonl")
        metrics.update(_reward_stats(groups))
        if len(groups) < tasks_per_step:
            return self._skip(pos.stage, metrics, f"only {len(groups)} usable task groups")
        t1 = time.perf_counter()
        batch, info = build_batch(groups, self.method, num_ranks=self._ranks(), token_budget=self.token_budget,
                                  buckets=self.buckets, row_multiple=batch_axis_size(self.mesh) if self.mesh else 1)
        metrics.update(info)
        if batch is None:
            return self._skip(pos.stage, metrics, info["reason"])
        batch = self.step_fn.place(batch)
        metrics["time/batch_s"] = time.perf_counter() - t1
        t2 = time.perf_counter()
        self.state, step_metrics = self.step_fn(self.state, batch)
        step_metrics = {k: float(v) for k, v in jax.device_get(step_metrics).items()}
        metrics.update(step_metrics)
        metrics["time/train_s"] = time.perf_counter() - t2
        if step_metrics["skipped"]:
            return self._skip(pos.stage, metrics, "non-finite loss or gradient")
        t3 = time.perf_counter()
        self.publish(self.state.params)
        metrics["time/publish_s"] = time.perf_counter() - t3
        self.version += 1
        outcome = StepOutcome(self.version, pos.stage, False, "", metrics)
        self._record(outcome)
        if self.checkpointer is not None and self.checkpointer.due(self.version):
            self.save()
        return outcome

    def _skip(self, stage: str, metrics: dict[str, Any], reason: str) -> StepOutcome:
        self.skipped_steps += 1
        outcome = StepOutcome(self.version, stage, True, reason, metrics)
        self._record(outcome)
        return outcome

    def _record(self, outcome: StepOutcome) -> None:
        outcome.metrics["time/step_s"] = time.monotonic() - self._t_start
        if self.metrics is not None:
            self.metrics.write(outcome.version, "step", {**outcome.metrics, "skipped_step": outcome.skipped,
                                                         "skip_reason": outcome.reason})

    def host_state(self) -> dict[str, Any]:
        """Returns the JSON record checkpointed beside the arrays."""
        return {**self.meta, "skipped_steps": self.skipped_steps, "data": self.stream.to_json(),
                "key": key_to_json(self.key) if self.key is not None else None}

    def save(self, force: bool = False) -> bool:
        """Saves (state, host state) at the current version; returns whether a save started."""
        if self.checkpointer is None:
            return False
        return self.checkpointer.save(self.version, self.state, self.host_state(), force=force)

    def restore_latest(self) -> bool:
        """Restores the newest checkpoint into this loop, if any; returns whether one was found."""
        if self.checkpointer is None or self.checkpointer.latest() is None:
            return False
        self.state, meta = self.checkpointer.restore(self.state)
        self.version = int(meta["version"])
        self.skipped_steps = int(meta.get("skipped_steps", 0))
        self.stream = DataStream.from_json(meta["data"])
        if meta.get("key") is not None:
            self.key = key_from_json(meta["key"])
        self.publish(self.state.params)
        return True

    async def run(self, total_steps: int, *, max_attempts: int | None = None, max_consecutive_skips: int = 20,
                  on_step: Callable[[StepOutcome], None] | None = None) -> list[StepOutcome]:
        """Trains until ``total_steps`` versions exist (or ``max_attempts`` attempts); saves at exit, always.

        Raises ``NoTrainableData`` after ``max_consecutive_skips`` skipped attempts in a row: a policy that never
        produces a trainable batch (e.g. a random initialisation that never succeeds) would otherwise loop forever.
        """
        outcomes = []
        attempts = skips = 0
        try:
            while self.version < total_steps and (max_attempts is None or attempts < max_attempts):
                outcome = await self.step()
                attempts += 1
                skips = skips + 1 if outcome.skipped else 0
                outcomes.append(outcome)
                if on_step is not None:
                    on_step(outcome)
                if skips >= max_consecutive_skips:
                    raise NoTrainableData(
                        f"{skips} attempts in a row at version {self.version} ({outcome.stage}) produced no "
                        f"trainable batch (last: {outcome.reason}); start from a policy that can succeed "
                        "sometimes (a pretrained or warm-started checkpoint) or check the task set")
        finally:
            self.save(force=True)
            if self.checkpointer is not None:
                self.checkpointer.wait()
        return outcomes


def _reward_stats(groups: Sequence[GroupCredit]) -> dict[str, float]:
    scalars = [d.scalar for g in groups for d in g.datums]
    if not scalars:
        return {}
    arr = np.asarray(scalars, np.float64)
    return {"advantage_mean": float(arr.mean()), "advantage_std": float(arr.std()),
            "advantage_abs_max": float(np.abs(arr).max())}


def make_meta(config: dict[str, Any], model_cfg, *, tokenizer_path: str | None,
              data_files: Sequence[str | Path] = ()) -> dict[str, Any]:
    """Returns the static part of the checkpoint record: model config, tokenizer path and provenance."""
    return {"model_config": model_config_record(model_cfg), "tokenizer_path": tokenizer_path,
            "run": run_metadata(config, list(data_files))}
