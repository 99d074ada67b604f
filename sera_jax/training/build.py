"""Builds a training run from a ``RunConfig``: mesh, model, tokenizer, optimizer state, engine, env workers, judge,
launchers per stage, checkpoints and metrics — everything ``train.Loop`` needs — and runs it. The config-only
pieces it shares with evaluation and the warm start (tasks, runtime settings, engine sizes, judge settings, the
tokenizer) come from ``sera_jax.assembly``.

``sera-train`` (``sera_jax.cli.train``) is a thin wrapper over ``train_from_config``.
"""

from __future__ import annotations

import asyncio
import contextlib
import sys
from pathlib import Path
from typing import Any, AsyncIterator, Callable

import jax

from sera_jax.agents.environments import environment
from sera_jax.agents.judge import frozen_policy_engine, make_judge
from sera_jax.agents.runtime import start_pool
from sera_jax.agents.subagent_judge import SubagentJudge
from sera_jax.assembly.concurrency import groups_in_flight, per_rank_concurrency
from sera_jax.assembly.engines import (JUDGE_KV_FRACTION, KV_FRACTION, engine_config, engine_maker, num_engines,
                                      simulated_engine_config, simulation)
from sera_jax.assembly.judge import judge_roles, judge_settings, uses_frozen_judge, uses_policy_judge
from sera_jax.assembly.roles import build_roles, close_roles, needs_frozen_engine
from sera_jax.assembly.settings import runtime_settings
from sera_jax.assembly.tasks import load_env_tasks
from sera_jax.assembly.tokenizer import resolve_tokenizer
from sera_jax.config import MissingPath, RunConfig, UserError, check_mesh
from sera_jax.config.validate import check_trainable_actor
from sera_jax.model import init_params, load_pretrained
from sera_jax.parallel.hosts import Exchange, PeerWatch, deal_ranks, start_distributed
from sera_jax.parallel.mesh import make_mesh
from sera_jax.rl.optim import make_optimizer
from sera_jax.sampling.replicas import EngineReplicas, local_copy
from sera_jax.training.checkpoint import Checkpointer, make_meta, sha256_file
from sera_jax.training.group_runner import GroupRunner
from sera_jax.training.loop import Loop, NoTrainableData, StepOutcome, StopRequested
from sera_jax.training.metrics import MetricsWriter
from sera_jax.training.resume import cut_back, describe_start, finished, summary_line
from sera_jax.training.run_lock import RunLock
from sera_jax.training.step import make_train_step, shard_train_state
from sera_jax.training.task_stream import TaskStream


def task_stream(cfg: RunConfig, num_tasks: int) -> TaskStream:
    """Returns the run's task order: one shard per admission rank (rollout.tasks_per_step), seeded by
    train.data_seed (null = train.seed), reshuffled each pass unless train.reshuffle_each_epoch is false."""
    t = cfg.train
    return TaskStream(num_tasks, seed=t.seed if t.data_seed is None else t.data_seed, ranks=cfg.rollout.tasks_per_step,
                      reshuffle=t.reshuffle_each_epoch)


def initial_params_from_run(run_dir: str | Path, model_cfg, mesh=None) -> Any:
    """Returns the newest checkpoint's parameters of the run at ``run_dir`` (``model.init_from``, e.g. the warm
    start), cast to ``model_cfg``'s parameter dtype, restored straight into the trainer's layout on ``mesh`` (any
    process count may have written it). Raises UserError when its architecture differs."""
    ck_dir = Path(run_dir) / "checkpoints"
    if not ck_dir.is_dir():
        raise MissingPath(f"model.init_from: no checkpoints in {run_dir} (expected {ck_dir})")
    ck = Checkpointer(ck_dir)
    try:
        saved = ck.read_meta().get("model_config", {})
        fields = ("vocab_size", "hidden_size", "intermediate_size", "num_layers", "num_heads", "num_kv_heads",
                  "head_dim", "tie_word_embeddings")
        diff = [f"{f}: {saved.get(f)} vs {getattr(model_cfg, f)}" for f in fields
                if saved.get(f) != getattr(model_cfg, f)]
        if diff:
            raise UserError(f"model.init_from: {run_dir} holds another architecture ({'; '.join(diff)})")
        _, params, _ = ck.restore_model(mesh=mesh)
    finally:
        ck.close()
    dtype = jax.numpy.dtype(model_cfg.param_dtype)
    return jax.tree.map(lambda x: x.astype(dtype), params)


@contextlib.asynccontextmanager
async def build_loop(cfg: RunConfig, *, out_dir: str | Path | None = None) -> AsyncIterator[Loop]:
    """Yields a ready ``Loop`` for ``cfg`` (resumed from the newest checkpoint in the run directory, if any) and
    closes its engine, env workers, checkpointer and metrics on exit."""
    start_distributed()  # a no-op when the command started it (it must precede any backend use)
    multi = jax.process_count() > 1
    exchange = Exchange("train") if multi else None
    out_dir = Path(out_dir or cfg.train.out_dir)
    # One writer per run directory (training/run_lock.py); process 0 writes the records, so it alone holds it, and
    # every process of a job hears whether it got it (none goes on into the collectives alone).
    lock = RunLock(out_dir) if jax.process_index() == 0 else None
    refused = None
    if lock is not None:
        try:
            lock.acquire()
        except UserError as e:
            refused = str(e)
    if multi:
        refused = exchange.allgather(refused, "lock")[0]
    if refused is not None:
        raise UserError(refused)
    try:
        async with _build_loop(cfg, out_dir, exchange) as loop:
            yield loop
    finally:
        if lock is not None:
            lock.release()


@contextlib.asynccontextmanager
async def _build_loop(cfg: RunConfig, out_dir: Path, exchange: Exchange | None) -> AsyncIterator[Loop]:
    multi = exchange is not None
    check_trainable_actor(cfg)  # before any compute: a training step trains every actor turn
    out_dir.mkdir(parents=True, exist_ok=True)
    check_mesh(cfg, jax.device_count())
    mesh = make_mesh(cfg.mesh)
    model_cfg = cfg.model_config()
    tokenizer, tok_path = resolve_tokenizer(cfg.model.tokenizer, cfg.model.hf_dir)
    if tokenizer.vocab_size > model_cfg.vocab_size:
        raise UserError(f"model.tokenizer: {tok_path} has {tokenizer.vocab_size} tokens, more than the model's "
                         f"vocab_size {model_cfg.vocab_size}")
    key = jax.random.key(cfg.train.seed)
    if cfg.model.init_from is not None:
        params = initial_params_from_run(cfg.model.init_from, model_cfg, mesh=mesh)
    elif cfg.model.hf_dir is not None:
        _, params = load_pretrained(cfg.model.hf_dir, mesh=mesh, param_dtype=model_cfg.param_dtype,
                                    dtype=model_cfg.dtype)
    else:
        params = init_params(jax.random.fold_in(key, 0), model_cfg)
    tx = make_optimizer(cfg.optim)
    state = shard_train_state(params, tx, model_cfg, mesh)
    del params
    step_fn = make_train_step(model_cfg, tx, cfg.step, mesh=mesh, state=state)
    sampler_dtype = "bfloat16" if jax.default_backend() == "gpu" else model_cfg.dtype
    tasks, files = load_env_tasks(cfg)
    method = cfg.method_config()
    env = cfg.env.name
    settings = runtime_settings(cfg)
    # TextWorld asks a judge for RT branch labels (rubric stage) and for the RAO family's sub-agent rewards.
    tw_rubric_stage, tw_execution_judge = judge_roles(cfg)
    # A frozen copy of the starting policy: the policy_frozen judge's and/or a frozen rubric writer's or scorer's.
    frozen_judge = uses_frozen_judge(cfg) or needs_frozen_engine(cfg)
    # One engine per local device (rollout.engines), each with its own pool; a task group runs on one of them.
    local = jax.local_devices()
    n_engines = num_engines(cfg, local)
    kv = KV_FRACTION - (JUDGE_KV_FRACTION if frozen_judge else 0.0)
    # This process's copy of the weights (a collective replicate in a multi-host job) seeds its engines.
    host_params = local_copy(state.params)
    # engine.backend: simulated: the engines' host path is real, their device a model of the target GPU's time.
    simulated = simulation(cfg) is not None
    engine = EngineReplicas.build(model_cfg, host_params,
                                  simulated_engine_config(cfg, n_engines) if simulated else
                                  engine_config(cfg, sampler_dtype, n_engines, kv),
                                  devices=[local[0]] * n_engines if simulated else local[:n_engines],
                                  tokenizer=tokenizer, seed=cfg.train.seed, make=engine_maker(cfg, tokenizer))
    judge = judge_engine = None
    if frozen_judge:
        # The initial policy's weights, never updated (the run's restore comes later and publishes only to
        # the policy engines): labels do not drift with training.
        judge_engine = frozen_policy_engine(
            model_cfg, host_params, engine_config(cfg, sampler_dtype, groups_in_flight(cfg),
                                                   JUDGE_KV_FRACTION), tokenizer, device=local[0])
    if tw_rubric_stage or tw_execution_judge:
        judge = make_judge(env, judge_settings(cfg), tokenizer=tokenizer,
                           generator=engine if uses_policy_judge(cfg) else judge_engine)
    roles = await build_roles(cfg, tokenizer=tokenizer, frozen=judge_engine, keep_dir=out_dir / "roles",
                              min_items=method.min_rubric_criteria)
    # Labels come after a group's trees, j.concurrency requests in flight over all groups (docs/design/recipes.md §1b, §3):
    # RT branches only of fork groups whose rubric is valid (the judge keeps its retries); sub-agents once each.
    branch_labels = SubagentJudge(judge, concurrency=cfg.judge.concurrency) if tw_rubric_stage else None
    execution_labels = (SubagentJudge(judge, concurrency=cfg.judge.concurrency, max_attempts=1)
                        if tw_execution_judge else None)
    pool = await start_pool(cfg.env.num_workers) if environment(env).needs_pool else None

    checkpointer = Checkpointer(out_dir / "checkpoints", every=cfg.train.checkpoint_every,
                                keep=cfg.train.keep_checkpoints)
    data_files = files + ([tok_path] if Path(tok_path).is_file() else [])
    run_group = GroupRunner(cfg, method, engine, tokenizer, settings, judge=judge, branch_labels=branch_labels,
                            execution_labels=execution_labels, pool=pool, roles=roles)
    loop = Loop(state=state, step_fn=step_fn, publish=engine.load_weights, run_group=run_group, tasks=tasks,
                method=method, stream=task_stream(cfg, len(tasks)), env=env,
                decode=tokenizer.decode, mesh=mesh, tasks_per_step=cfg.rollout.tasks_per_step,
                stage_tasks_per_step=({} if cfg.rollout.rubric_stage_tasks_per_step is None else
                                      {"rubric_generation": cfg.rollout.rubric_stage_tasks_per_step}),
                concurrency=per_rank_concurrency(cfg.max_concurrent_rollouts(), cfg.rollout.tasks_per_step),
                max_offpolicyness=method.max_head_offpolicyness,
                speculative=cfg.rollout.speculative_groups_per_rank, token_budget=cfg.batch.token_budget,
                buckets=cfg.batch.buckets, advantage_clip=cfg.batch.advantage_clip,
                deterministic=cfg.train.deterministic_scheduling,
                filter_zero_variance=cfg.execution_filter_zero_variance(), key=key, checkpointer=checkpointer,
                metrics=None, checkpoint_fallback=cfg.train.checkpoint_fallback,
                meta=make_meta(cfg.to_dict(), model_cfg, tokenizer_path=tok_path, data_files=data_files),
                trees_dir=out_dir / "trees",
                engine_stats=engine.stats, engine=engine, judge_engine=judge_engine, tokenizer=tokenizer,
                warm_micro_batches=tuple(cfg.train.warmup_micro_batches), exchange=exchange,
                trees_suffix=f".p{jax.process_index()}" if multi else "")
    del host_params
    watch = PeerWatch(prog="sera-train").start() if multi else None
    stop_signals: list[int] = []
    agreed = True  # every process leaves together (not after this process's own error: its peers are elsewhere)
    try:
        # A finished run compiles nothing: its rerun only says so (and no warm-up thread outlives it).
        if cfg.train.warmup and not finished(checkpointer, cfg.train.total_steps):
            if judge_engine is not None:
                judge_engine.warmup()
            loop.warmup(log=lambda m: print(m, file=sys.stderr, flush=True))
        start = describe_start(cfg, loop.restore_latest(), loop.version)
        if jax.process_index() == 0:
            # Records of attempts the restored checkpoint does not hold are cut back before any is written again.
            cut = cut_back(out_dir, loop.version, loop.skipped_steps)
            loop.metrics = MetricsWriter(out_dir)
            if cut["tensorboard_reset"]:
                loop.metrics.replay(cut["records"])
            print("; ".join(x for x in (start, summary_line(cut)) if x), file=sys.stderr, flush=True)
        else:
            loop.metrics = MetricsWriter(out_dir)
        if multi:
            ranks = deal_ranks(cfg.rollout.tasks_per_step)
            print(f"process {jax.process_index()} of {jax.process_count()}: admission ranks {ranks}, "
                  f"{len(local)} local devices, from version {loop.version}", file=sys.stderr, flush=True)
            stop_signals = _stop_on_signals(loop)
        yield loop
    except (StopRequested, NoTrainableData):
        raise
    except BaseException:
        agreed = False
        raise
    finally:
        for sig in stop_signals:
            asyncio.get_running_loop().remove_signal_handler(sig)
        step_fn.stop_warm()  # a compile thread alive at interpreter exit aborts it
        engine.close()
        if judge_engine is not None:
            judge_engine.close()
        if pool is not None:
            await pool.close()
        await close_roles(roles)
        checkpointer.close()
        if loop.metrics is not None:
            loop.metrics.close()
        if multi and agreed:
            # The command shuts the runtime down at its end (parallel.hosts.finish_distributed): an evaluation may
            # follow. Here every process only leaves the loop together.
            watch.stop()
            exchange.barrier("loop-end")


def _stop_on_signals(loop: Loop) -> list[int]:
    """Routes SIGINT and SIGTERM to ``loop.request_stop`` (a multi-host job: every process must reach the same
    step's exchange and save together, so a signal must not unwind one process on its own); returns them."""
    import signal

    ev = asyncio.get_running_loop()
    sigs = [signal.SIGINT, signal.SIGTERM]
    for sig in sigs:
        ev.add_signal_handler(sig, loop.request_stop, int(sig))
    return sigs


async def train_from_config(cfg: RunConfig, *, out_dir: str | Path | None = None, max_attempts: int | None = None,
                            on_step: Callable[[StepOutcome], None] | None = None) -> list[StepOutcome]:
    """Trains ``cfg`` to ``train.total_steps`` versions (resuming if the run directory has checkpoints); returns
    the outcome of every attempt."""
    async with build_loop(cfg, out_dir=out_dir) as loop:
        return await loop.run(cfg.train.total_steps, max_attempts=max_attempts, on_step=on_step)


def config_file_hashes(paths: list[str]) -> dict[str, str]:
    """Returns sha256 of the given config files (recorded with the run)."""
    return {p: sha256_file(p) for p in paths if Path(p).is_file()}


def run(cfg: RunConfig, **kw: Any) -> list[StepOutcome]:
    """Synchronous wrapper of ``train_from_config``."""
    return asyncio.run(train_from_config(cfg, **kw))
