"""The training loop: stage ← kernel(version); trees ← rollouts; datums ← credit; state ← train_step; publish.

One policy version per optimizer step (docs/design/algorithm.md §6.3, §7). For version v the stage kernel names the objective, and the
step trains one accepted task group (``rollout.trees_per_task`` root trees of one task) per admission rank, as the
reference's 8 ranks do: ``training/admission.py`` runs the groups under docs/design/recipes.md §2's quota (a rejected group is
replaced by the rank's next task; every accepted group is trained; staleness ≤ ``max_head_offpolicyness``, and a
group the bound lets run across the update keeps generating while the trainer updates). A step with fewer trainable
datums than ranks (docs/design/recipes.md §2.7), or with a non-finite loss, is skipped: the version does not advance, its groups
are discarded, and the same stage is sampled again.

Everything the loop needs to continue is checkpointed with the state: version, skipped-step count, data order and
cursors (with the tasks of groups still running handed back, so none is lost), the PRNG key, the model config and provenance (``sera_jax.training.checkpoint``).

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
import sys
import time
from pathlib import Path
from typing import Any, Callable, Sequence

import jax
import numpy as np

from sera_jax.agents import infra
from sera_jax.agents.efficiency import RunWatch
from sera_jax.agents.env_name import EnvName
from sera_jax.agents.keys import warm_keys
from sera_jax.agents.phases import phase_times, tracing
from sera_jax.agents.records import write_jsonl
from sera_jax.parallel.hosts import deal_ranks
from sera_jax.rl.baselines import (
    GroupCredit,
    step_rubric_credit,
    task_group_credit,
    warm_credit,
)
from sera_jax.rl.shapes import step_shapes
from sera_jax.rl.stages import MethodConfig, position
from sera_jax.sampling import compile_watch
from sera_jax.training.admission import Admission
from sera_jax.training.checkpoint import (
    Checkpointer,
    key_from_json,
    key_to_json,
)
from sera_jax.training.intact import drop, restore_newest_intact, restore_same_architecture
from sera_jax.training.metrics import MetricsWriter
from sera_jax.training.shared_step import SharedStep, local_figures
from sera_jax.training.step_batch import build_batch, build_shared_batch
from sera_jax.training.stats import tree_metrics
from sera_jax.training.step import CompiledStep, TrainState, batch_axis_size
from sera_jax.training.task_stream import TaskStream, merge_streams


class NoTrainableData(RuntimeError):
    """Training cannot progress: too many consecutive steps were skipped for lack of trainable data."""


class StopRequested(Exception):
    """Every process of the job agreed to stop at this step (a signal reached ``by``); the run saves and ends."""

    def __init__(self, signum: int, by: Sequence[int] = (0,)):
        super().__init__(f"signal {signum} on process {', '.join(map(str, by))}")
        self.signum, self.by = signum, list(by)


@dataclasses.dataclass
class StepOutcome:
    """What one attempt at policy version ``version`` produced."""

    version: int
    stage: str
    skipped: bool
    reason: str
    metrics: dict[str, Any]


RECORD_ERROR = "RecordError"  # the infrastructure reason of a tree the loop could not record


@dataclasses.dataclass
class Loop:
    """The pieces one training run wires together (``training/build.py`` builds them from a config)."""

    state: TrainState
    step_fn: CompiledStep
    publish: Callable[[Any], int]                     # new params → sampler; returns the sampler's version
    run_group: Callable[[Any, str, int], Any]         # async: one task group's trees (training/group_runner.py)
    tasks: Sequence[Any]
    method: MethodConfig
    stream: TaskStream
    env: EnvName
    decode: Callable[[list[int]], str]
    mesh: Any
    tasks_per_step: int = 8
    stage_tasks_per_step: dict[str, int] = dataclasses.field(default_factory=dict)  # per-stage overrides
    concurrency: int = 1                              # per rank (docs/design/recipes.md §2.2 C)
    max_offpolicyness: int = 0                        # versions a trained group may lag (§2.4, §2.5)
    speculative: int = 0                              # extra groups per rank beyond the quota (admission.py)
    token_budget: int = 60_000
    buckets: Sequence[int] = (256, 512, 1024, 2048, 4096, 8192, 12288, 16384)
    advantage_clip: float | None = 20.0               # ± bound of a packed advantage (config batch.advantage_clip)
    deterministic: bool = False
    min_trainable: int | None = None                  # skip threshold; None = the stage's tasks_per_step
    filter_zero_variance: bool | None = None
    max_group_attempts: int | None = None
    version: int = 0
    skipped_steps: int = 0
    key: Any = None
    checkpointer: Checkpointer | None = None
    metrics: MetricsWriter | None = None
    meta: dict[str, Any] = dataclasses.field(default_factory=dict)
    trees_dir: str | Path | None = None               # every attempt's trees as JSONL (sera-view reads them)
    engine_stats: Callable[[], list[dict[str, int]]] | None = None  # the sampling engines' counters (rollout/*)
    engine: Any = None                                # the policy's sampling engines (EngineReplicas: warm-up, busy
                                                      # fraction; callers evaluate on them)
    judge_engine: Any = None                          # the policy_frozen judge's engine, or None
    tokenizer: Any = None                             # for callers that render trees or evaluate
    warm_micro_batches: Sequence[int] = (1, 2, 3, 4)  # micro-batch counts the warm-up compiles the step for
    exchange: Any = None                              # parallel.hosts.Exchange of a multi-host job (None: one)
    trees_suffix: str = ""                            # tree files' name suffix (".p<i>" per process of a job)
    checkpoint_fallback: bool = True                  # a torn newest checkpoint: fall back (False: refuse)
    log: Callable[[str], None] = dataclasses.field(default=lambda m: print(m, file=sys.stderr, flush=True))
    _stop_signal: int = dataclasses.field(default=0, init=False, repr=False)
    _stop_event: Any = dataclasses.field(default=None, init=False, repr=False)
    _t_start: float = dataclasses.field(default=0.0, init=False, repr=False)  # the current attempt's start

    _admission: Admission | None = dataclasses.field(default=None, init=False, repr=False)

    @property
    def admission(self) -> Admission:
        """The rollout admission over the loop's current stream (rebuilt when a restore replaces the stream)."""
        if self._admission is None or self._admission.stream is not self.stream:
            self._admission = Admission(self.run_group, self._credit, self.tasks, self.stream,
                                        concurrency=self.concurrency, max_offpolicyness=self.max_offpolicyness,
                                        speculative=self.speculative)
        return self._admission

    def _credit(self, stage: str, trees: list) -> GroupCredit:
        # Trees an env host failed are not the policy's failures: credited without them; none left, rejected.
        kept = [t for t in trees if not infra.failed(t)]
        if not kept:
            return GroupCredit([], False)
        trees = kept
        return task_group_credit(stage, trees, self.method, decode=self.decode, env=self.env,
                                 filter_zero_variance=self.filter_zero_variance if stage == "execution" else None)

    async def step(self) -> StepOutcome:
        """Runs one attempt at the current version; returns what happened (the version advances on success).

        In a multi-host job (``exchange`` set, several processes) this process runs its own admission ranks' groups,
        then every process shares its step figures (``training.shared_step``) and makes the same decisions from
        them; a stop requested on any process (``request_stop``) raises ``StopRequested`` everywhere at that point.
        """
        pos = position(self.version, self.method.stage_schedule)
        tasks_per_step = self.stage_tasks_per_step.get(pos.stage, self.tasks_per_step)
        multi = self.exchange is not None and jax.process_count() > 1
        ranks: int | list[int] = tasks_per_step
        max_attempts = self.max_group_attempts or 4 * tasks_per_step * (1 + self.speculative)
        if multi:
            # A stage with fewer ranks keeps each rank with the process that owns it in the full deal, so a rank's
            # data cursor only ever moves in one process.
            ranks = [r for r in deal_ranks(self.tasks_per_step) if r < tasks_per_step]
            max_attempts = -(-max_attempts * len(ranks) // tasks_per_step)
        self._t_start = t0 = time.monotonic()
        self._compiles0 = compile_watch.snapshot()
        self._traced0 = compile_watch.traced_functions()
        watch = RunWatch(self.engine)
        trace = watch.trace
        engine_before = self.engine_stats() if self.engine_stats is not None else None
        with tracing(trace):  # tasks started inside (every group, tree, side call) record into this trace
            admitted, stats = await self._collect(pos.stage, ranks, max_attempts, stoppable=multi)
        groups = [g.credit for g in admitted]
        t_end = time.monotonic()
        trees = stats.pop("tree_records")
        step_scope = pos.stage == "rubric_generation" and self.method.rubric_baseline_scope == "step"
        if step_scope and not multi:
            groups = step_rubric_credit(groups, self.method.rubric_advantage_sign)
        metrics: dict[str, Any] = {"stage": pos.stage, "groups_accepted": len(groups), **stats,
                                   "time/rollout_s": t_end - t0}
        phases = phase_times(trace, t0, t_end)
        metrics.update({f"time/{k}": v for k, v in phases.items() if k != "uncovered_s"})
        metrics["time/rollout_uncovered_s"] = phases["uncovered_s"]
        generation: dict[str, float] = {}
        if engine_before is not None:
            after = self.engine_stats()
            generation = {k: float(sum(a.get(k, 0) - b.get(k, 0) for a, b in zip(after, engine_before)))
                          for k in after[0]} if after else {}
            metrics.update(generation_metrics(engine_before, after, t_end - t0))
        eff = watch.finish()
        if "engine_busy_fraction" in eff:
            metrics["rollout/engine_busy_fraction"] = eff["engine_busy_fraction"]
        metrics.update({f"agents/{k[6:]}": v for k, v in eff.items() if k.startswith("agent_")})
        # First, so the trees it could not record count as infrastructure failures below.
        unrecorded = self._write_trees(trees) if self.trees_dir is not None else 0
        stats["unrecorded_trees"] = unrecorded  # of infra_failed_trees (a multi-host step sums every process's)
        local_trees = tree_metrics(trees, env=self.env)
        # Trees failed in their rollout (this process's; a multi-host record counts all). A tree failed only in its
        # record was credited when its group finished and keeps that credit (_write_trees logs it).
        rollout_failed = [t for t in trees if infra.failed(t) and not t.misc[infra.INFRA_KEY].startswith(RECORD_ERROR)]
        if rollout_failed:
            first = rollout_failed[0].misc[infra.INFRA_KEY].split("; ")[0][:160]
            self.log(f"version {self.version}: {len(rollout_failed)} trees failed by infrastructure, kept out of "
                     f"credit (first: {first})")
        shared = None
        if multi:
            # Waited for off the event loop: groups the staleness bound carries across the update keep generating.
            shared = SharedStep(await asyncio.to_thread(self.exchange.allgather, local_figures(
                stage=pos.stage, version=self.version, groups=groups, stats=stats, trees=trees,
                rubric_step_scope=step_scope,
                times={k: float(v) for k, v in metrics.items() if k.startswith("time/")},
                generation=generation, efficiency={k: float(v) for k, v in eff.items()},
                stop=self._stop_signal), "step"))
            if shared.stop:
                raise StopRequested(shared.stop, shared.stopped_by)
            if step_scope:
                pool, offset = shared.rubric_pool(jax.process_index())
                groups = step_rubric_credit(groups, self.method.rubric_advantage_sign, pool=pool, offset=offset)
            metrics = {"stage": pos.stage, **shared.metrics(env=self.env, sign=self.method.rubric_advantage_sign,
                                                            rubric_step_scope=step_scope)}
        else:
            metrics.update(local_trees)
            metrics["unrecorded_trees"] = float(unrecorded)
            metrics.update(_reward_stats(groups))
            metrics.update(token_staleness(groups, self.version))
        n_groups = shared.groups if shared is not None else len(groups)
        if n_groups < tasks_per_step:
            return self._skip(pos.stage, metrics, f"only {n_groups} usable task groups")
        t1 = time.perf_counter()
        min_trainable = self.min_trainable if self.min_trainable is not None else tasks_per_step
        row_multiple = batch_axis_size(self.mesh) if self.mesh else 1
        if shared is None:
            batch, info = build_batch(groups, self.method, min_trainable=min_trainable,
                                      token_budget=self.token_budget, buckets=self.buckets,
                                      row_multiple=row_multiple, warmed_micro_batches=self.warm_micro_batches,
                                      advantage_clip=self.advantage_clip)
        else:
            batch, info = build_shared_batch(groups, shared, self.method, min_trainable=min_trainable,
                                             token_budget=self.token_budget, buckets=self.buckets,
                                             row_multiple=row_multiple, warmed_micro_batches=self.warm_micro_batches,
                                             agree=lambda n: max(self.exchange.allgather(n, "micro")),
                                             advantage_clip=self.advantage_clip)
        metrics.update(info)
        if batch is None:
            return self._skip(pos.stage, metrics, info["reason"])
        # The step's executables may still be compiling in the background (the warm-up): waited for off the event
        # loop, before placing the batch (placing runs small programs the warm-up compiles too).
        metrics["compile/warmup_wait_s"] = await asyncio.to_thread(self.step_fn.wait_warm)
        batch = self.step_fn.place(batch, local=shared is not None)
        metrics["time/batch_s"] = time.perf_counter() - t1 - metrics["compile/warmup_wait_s"]
        t2 = time.perf_counter()
        if stats["groups_carried"] and not self.deterministic:
            # Groups the staleness bound lets run across the update keep generating meanwhile (the reference pauses
            # them only for the weight push): the update runs off the event loop.
            self.state, step_metrics = await asyncio.to_thread(self.step_fn, self.state, batch)
        else:
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
        metrics.update(self._compile_metrics())
        outcome = StepOutcome(self.version, pos.stage, False, "", metrics)
        self._record(outcome)
        if self.checkpointer is not None and self.checkpointer.due(self.version):
            self.save()
        return outcome

    def request_stop(self, signum: int) -> None:
        """Asks the run to stop (a signal handler's call, on the event loop): this process's rollouts are cut short,
        and at the step's exchange every process agrees to stop (``StopRequested``), saves and ends."""
        self._stop_signal = self._stop_signal or int(signum)
        if self._stop_event is not None:
            self._stop_event.set()

    async def _collect(self, stage: str, ranks: int | list[int], max_attempts: int, *, stoppable: bool):
        """Returns the admission's (groups, stats) for this step, or (nothing, empty stats) once a stop is asked
        for (``stoppable``: a multi-host job, where a stop must reach the exchange rather than unwind the process
        out of step with its peers)."""
        if not stoppable:
            return await self.admission.collect(stage, self.version, ranks, max_attempts=max_attempts)
        if self._stop_event is None:
            self._stop_event = asyncio.Event()
            if self._stop_signal:
                self._stop_event.set()
        stopped: dict[str, Any] = {"groups_started": 0, "groups_rejected": 0, "groups_speculative": 0,
                                   "groups_cancelled": 0, "groups_carried": 0, "groups_stale_dropped": 0,
                                   "trees": 0, "tree_records": []}
        if self._stop_event.is_set():
            return [], stopped
        collect = asyncio.ensure_future(self.admission.collect(stage, self.version, ranks,
                                                               max_attempts=max_attempts))
        stop = asyncio.ensure_future(self._stop_event.wait())
        await asyncio.wait([collect, stop], return_when=asyncio.FIRST_COMPLETED)
        if collect.done():
            stop.cancel()
            return collect.result()
        collect.cancel()
        await asyncio.gather(collect, return_exceptions=True)
        await self.admission.close()  # running groups' tasks go back to their ranks' streams
        return [], stopped

    def _compile_metrics(self) -> dict[str, Any]:
        """JAX traces and compilations during the current attempt (0 once the warm-up covered its shapes)."""
        c = compile_watch.since(getattr(self, "_compiles0", {}))
        before = getattr(self, "_traced0", {})
        traced = {f: n - before.get(f, 0) for f, n in compile_watch.traced_functions().items() if n > before.get(f, 0)}
        return {"compile/traced_functions": traced,  # which functions missed their cache (JSON only)
                "compile/traces": c["traces"], "compile/compiles": c["compiles"],
                "compile/trace_s": c["traces_s"] + c["lowerings_s"], "compile/compile_s": c["compiles_s"],
                "compile/ahead_compiles": c["ahead_compiles"],
                "compile/ahead_s": c["ahead_traces_s"] + c["ahead_lowerings_s"] + c["ahead_compiles_s"]}

    def warmup(self, log: Callable[[str], None] | None = None) -> dict[str, float]:
        """Compiles, before the first attempt, what the attempts run: every engine shape, the key derivations and
        the publish; and starts compiling the train step at every bucket for ``warm_micro_batches`` micro-batch counts
        in the background (ahead of time: nothing runs), while the first rollout generates — the first update waits
        for it (``compile/warmup_wait_s``). Returns the counts and the seconds the foreground part took."""
        t0 = time.monotonic()
        out: dict[str, float] = {}
        if self.engine is not None:
            out["engine_executables"] = float(self.engine.warmup(self.state.params))
        warm_keys()
        warm_credit()
        shapes = step_shapes(self.token_budget, self.buckets, batch_axis_size(self.mesh) if self.mesh else 1,
                             self.warm_micro_batches)
        self.step_fn.warm_in_background(self.state, shapes)
        out["step_executables"] = float(len(shapes))
        out["seconds"] = time.monotonic() - t0
        if log is not None:
            log(f"warm-up: {out.get('engine_executables', 0):.0f} engine executables in {out['seconds']:.1f} s; "
                f"{len(shapes)} train step shapes compiling in the background")
        return out

    def _write_trees(self, trees: list) -> int:
        """Appends the attempt's trees to its JSONL file; returns how many it could not record. Such a tree is an
        infrastructure failure (``infra_failed_trees``; logged), never an exception out of the step. Its credit was
        assigned when its group finished and stands: strings always record (``records.dumps_tree``), so what is
        left is a value JSON cannot hold, a program's error rather than the policy's."""
        unrecorded = []

        def failed(tree: Any, exc: BaseException) -> None:
            infra.mark_tree(tree, f"{RECORD_ERROR}: the tree could not be recorded ({type(exc).__name__}: {exc})"[:240])
            unrecorded.append(tree.id)

        path = Path(self.trees_dir) / f"v{self.version:06d}_{self.skipped_steps:04d}{self.trees_suffix}.jsonl"
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            write_jsonl(trees, path, on_error=failed)
        except OSError as e:  # the file itself: no tree of the attempt is recorded
            unrecorded.clear()
            for tree in trees:
                failed(tree, e)
        if unrecorded:
            self.log(f"version {self.version}: {len(unrecorded)} trees could not be recorded in {path} "
                     f"(first: {unrecorded[0]})")
        return len(unrecorded)

    def _skip(self, stage: str, metrics: dict[str, Any], reason: str) -> StepOutcome:
        self.skipped_steps += 1
        metrics.update(self._compile_metrics())
        outcome = StepOutcome(self.version, stage, True, reason, metrics)
        self._record(outcome)
        return outcome

    def _record(self, outcome: StepOutcome) -> None:
        outcome.metrics["time/step_s"] = time.monotonic() - self._t_start
        if self.metrics is not None:
            self.metrics.write(outcome.version, "step", {**outcome.metrics, "skipped_step": outcome.skipped,
                                                         "skip_reason": outcome.reason})

    def host_state(self) -> dict[str, Any]:
        """Returns the JSON record checkpointed beside the arrays; the tasks of groups still running are handed back
        to the stream's record (a resumed run draws them first)."""
        data = self.stream.to_json()
        if self._admission is not None:
            for r, idx in self._admission.pending().items():
                data["requeued"][r % self.stream.ranks] = idx + data["requeued"][r % self.stream.ranks]
        if self.exchange is not None and jax.process_count() > 1:
            data = merge_streams(self.exchange.allgather(data, "stream"), self.tasks_per_step)
        return {**self.meta, "skipped_steps": self.skipped_steps, "data": data,
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
        # The newest intact version: a torn newer one is reported, passed over (unless refused) and deleted, so
        # this run's save at that version is not skipped as already present (sera_jax.training.intact).
        _, (self.state, meta), torn = restore_newest_intact(
            self.checkpointer.manager.all_steps(),
            lambda v: restore_same_architecture(self.checkpointer, v, self.state, self.meta.get("model_config")),
            directory=str(self.checkpointer.directory), fallback=self.checkpoint_fallback, log=self.log)
        drop(self.checkpointer.manager, torn)
        self.version = int(meta["version"])
        self.skipped_steps = int(meta.get("skipped_steps", 0))
        self.stream = TaskStream.from_json(meta["data"])
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
        agreed = True  # whether every process reaches the final save (not after one process's own error)
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
        except (StopRequested, NoTrainableData):
            raise  # decided identically on every process: all of them save below
        except BaseException:
            # One process's own failure: its peers are elsewhere in the step, so a collective save would hang. They
            # stop when this process is gone (parallel.hosts.PeerWatch); the newest periodic checkpoint resumes.
            agreed = self.exchange is None or jax.process_count() == 1
            raise
        finally:
            if self._admission is not None:
                await self._admission.close()  # running groups' tasks go back to the stream before the save
            if agreed:
                self.save(force=True)
            if self.checkpointer is not None:
                self.checkpointer.wait()
        return outcomes


def generation_metrics(before: Sequence[dict[str, int]], after: Sequence[dict[str, int]], seconds: float
                       ) -> dict[str, float]:
    """Returns the rollout's generation efficiency from the engines' counters before and after it (every policy
    call: agent turns, rubric and scoring calls): ``rollout/completion_tokens`` and ``…_per_s`` over the rollout's
    wall time, ``rollout/prefill_tokens`` (prompt tokens computed), ``rollout/cached_prompt_tokens`` (reused from
    the prefix cache), and ``rollout/mean_live_rows`` / ``rollout/mean_batch_rows`` per decode chunk."""
    def delta(key: str) -> int:
        return sum(a.get(key, 0) - b.get(key, 0) for a, b in zip(after, before))
    gen, chunks = delta("generated_tokens"), delta("decode_calls")
    return {"rollout/completion_tokens": float(gen),
            "rollout/completion_tokens_per_s": gen / seconds if seconds > 0 else 0.0,
            "rollout/prefill_tokens": float(delta("prefill_tokens")),
            "rollout/cached_prompt_tokens": float(delta("cached_tokens")),
            "rollout/mean_live_rows": delta("decode_live_rows") / chunks if chunks else 0.0,
            "rollout/mean_batch_rows": delta("decode_batch_rows") / chunks if chunks else 0.0}


def token_staleness(groups: Sequence[GroupCredit], version: int) -> dict[str, float]:
    """Returns how many versions the step's trained tokens lag the version they train (docs/design/recipes.md §2.4–2.5):
    ``staleness_max`` (0 under max_head_offpolicyness = 0) and the token mean ``staleness_mean``."""
    lags = [version - v for g in groups for d in g.datums if d.trainable
            for v, m in zip(d.versions, d.mask) if m and v >= 0]
    if not lags:
        return {}
    return {"staleness_max": float(max(lags)), "staleness_mean": float(np.mean(lags))}


def _reward_stats(groups: Sequence[GroupCredit]) -> dict[str, float]:
    advantages = [d.advantage for g in groups for d in g.datums]
    if not advantages:
        return {}
    arr = np.asarray(advantages, np.float64)
    return {"advantage_mean": float(arr.mean()), "advantage_std": float(arr.std()),
            "advantage_abs_max": float(np.abs(arr).max())}
