"""``sera-eval``'s pass: the paper's protocol (``protocol.py``) on a task set for any policy — in process or behind
an endpoint — written so that a kill loses nothing finished, and split into shards that separate machines run.

A pass is (run, task) keys. Its output directory is pinned at the first start (``identity.py``: policy, protocol,
task partition; ``store.py``'s ``identity.json``): a rerun that differs is refused in one line. Each key's trees and
its record are appended (one write and an ``fsync`` each) the moment the task ends, so a SIGKILL loses only the tasks
in flight; rerunning the same command skips the finished keys and retries the errored ones, and says how many of
each. One writer per shard (its lock). SIGTERM ends the pass with what is finished saved (the CLI exits 143).

Shards: ``num_shards`` N, ``shard_index`` I: task i of the picked task set belongs to shard i mod N, with its own
files under ``DIR/shard-I-of-N``. A shard writes no report; ``aggregate(DIR)`` writes it once every shard is
complete. With one shard the report is written at the end of the pass, from the stored records: a resumed pass's
report equals an uninterrupted one's.

A multi-host JAX job (``jax.distributed``) keeps the protocol's own split (``protocol.evaluate_distributed``).
"""

from __future__ import annotations

import dataclasses
import json
import sys
import time
from pathlib import Path
from typing import Any, Callable

import jax

from sera_jax.agents.efficiency import RunWatch
from sera_jax.agents.environments import environment
from sera_jax.agents.keys import warm_keys
from sera_jax.agents.phases import tracing
from sera_jax.agents.runtime import start_pool
from sera_jax.assembly.endpoint import endpoint_policy
from sera_jax.assembly.engines import engine_config, engine_maker, simulated_engine_config, simulation
from sera_jax.assembly.settings import runtime_settings
from sera_jax.config import RunConfig
from sera_jax.evaluation.identity import engine_identity, protocol_identity, served_identity, tasks_identity
from sera_jax.evaluation.protocol import (evaluate_distributed, evaluate_tasks, load_eval_tasks, load_policy,
                                          selection_settings, tree_means, write_outputs)
from sera_jax.evaluation.report import DIFFICULTY_ORDER, Outcome, report, summarise
from sera_jax.evaluation.store import EvalStore, collect, merge_trees, partition_hash, shard_dir, shard_tasks
from sera_jax.parallel.mesh import MeshConfig, make_mesh

SESSIONS = "sessions.jsonl"   # per shard: one line per session (what it ran, how long, its engine's figures)
META = "meta.json"            # beside identity.json: what the report says of the pass (not pinned)


@dataclasses.dataclass(frozen=True)
class PassSpec:
    """What ``evaluate`` is asked for beyond the config: the policy's source and the shard."""

    checkpoint: str | Path | None = None
    hf_dir: str | Path | None = None
    version: int | None = None
    tokenizer: str | None = None          # a served model's tokenizer (overrides endpoint.tokenizer)
    num_tasks: int | None = None
    num_runs: int | None = None
    num_shards: int = 1
    shard_index: int = 0


def say(line: str) -> None:
    sys.stderr.write(line + "\n")  # one write: no other thread's output lands mid-line
    sys.stderr.flush()


async def _policy(cfg: RunConfig, spec: PassSpec, out_dir: Path) -> tuple[Any, Any, Any, dict, str]:
    """Returns (generator, tokenizer, the engine to close or None, the policy's pinned identity, its words)."""
    if cfg.endpoint.urls:
        policy = await endpoint_policy(cfg, out_dir / ".tokenizers", tokenizer=spec.tokenizer)
        d = policy.describe()
        return policy, policy.tokenizer, None, served_identity(policy), (
            f"endpoint {', '.join(d['endpoints'])} model {d['model']!r}")
    p = load_policy(cfg, checkpoint=spec.checkpoint, hf_dir=spec.hf_dir, version=spec.version)
    if p.tokenizer.vocab_size > p.model_cfg.vocab_size:
        raise ValueError(f"tokenizer {p.tokenizer_path} has {p.tokenizer.vocab_size} tokens, more than the model's "
                         f"vocab_size {p.model_cfg.vocab_size}")
    ident = engine_identity(p.model_cfg, p.params, p.tokenizer_path)
    dtype = "bfloat16" if jax.default_backend() == "gpu" else p.model_cfg.dtype
    # engine.backend: simulated (--simulate GPU): the same host path on a simulated device; pinned as such, so a
    # simulated pass never resumes a real one's directory (or the other way round).
    sim = simulation(cfg)
    if sim is not None:
        ident = {**ident, "simulated": sim.target}
    ec = (simulated_engine_config(cfg, 1, evaluation=True, model_cfg=p.model_cfg) if sim is not None else
          engine_config(cfg, dtype, evaluation=True, model_cfg=p.model_cfg))
    engine = engine_maker(cfg, p.tokenizer, p.model_cfg)(
        p.model_cfg, p.params, ec, tokenizer=p.tokenizer, mesh=make_mesh(MeshConfig(1, 1, 1), jax.local_devices()[:1]),
        seed=cfg.train.seed)
    return engine, p.tokenizer, engine, ident, p.source


def _fresh(out_dir: Path) -> None:
    """Removes an earlier pass's files (a caller-supplied generator has no identity to resume under)."""
    for name in ("identity.json", META, "results.jsonl", "trees.jsonl", "plan.json", SESSIONS,
                 "report.json", "report.md"):
        (out_dir / name).unlink(missing_ok=True)


async def evaluate(cfg: RunConfig, *, out_dir: str | Path, spec: PassSpec = PassSpec(), generator: Any = None,
                   tokenizer: Any = None, wrap_generator: Callable[[Any], Any] | None = None,
                   on_run: Callable[[int, dict], None] | None = None, progress: bool = False) -> dict | None:
    """Runs (or finishes) a pass under the protocol and returns its report (written as report.json/.md with the
    trees in trees.jsonl), or None for a shard of several (``aggregate`` writes the report).

    ``generator``/``tokenizer`` replace the policy (the training loop's engine, a test double): such a pass starts
    afresh, since nothing pins what generates. ``wrap_generator`` wraps whichever generator is used (to inject
    failures). Raises UserError for a mistake (a differing rerun, a second writer, an unreachable endpoint, …)."""
    out_dir = Path(out_dir)
    if cfg.endpoint.urls and cfg.env.token_history:
        # A chat server encodes the conversation from its text: a prompt extended with the sampled tokens would
        # record ids the served model never saw (a re-encoded completion may split otherwise).
        say("sera-eval: note: env.token_history is off for a served policy (the server re-encodes the conversation)")
        cfg = dataclasses.replace(cfg, env=dataclasses.replace(cfg.env, token_history=False))
    if jax.process_count() > 1:
        return await evaluate_distributed(cfg, out_dir=out_dir, checkpoint=spec.checkpoint, hf_dir=spec.hf_dir,
                                          version=spec.version, num_tasks=spec.num_tasks, num_runs=spec.num_runs,
                                          generator=generator, tokenizer=tokenizer, wrap_generator=wrap_generator,
                                          on_run=on_run, progress=progress)
    e = cfg.eval
    runs = e.num_runs if spec.num_runs is None else spec.num_runs
    tasks = load_eval_tasks(cfg, spec.num_tasks)
    mine = shard_tasks(tasks, spec.num_shards, spec.shard_index)
    settings = runtime_settings(cfg, evaluation=True)
    store = EvalStore(out_dir, num_shards=spec.num_shards, shard_index=spec.shard_index)
    engine = pool = served = None
    try:
        if generator is None:
            generator, tokenizer, engine, pinned, source = await _policy(cfg, spec, out_dir)
            served = generator if engine is None else None
        else:
            pinned, source = {"kind": "caller", "what": type(generator).__name__}, "generator"
            out_dir.mkdir(parents=True, exist_ok=True)
            _fresh(store.directory)
            (out_dir / "identity.json").unlink(missing_ok=True)
        identity = {"policy": pinned,
                    "protocol": protocol_identity(cfg, runs, dataclasses.asdict(settings)),
                    "tasks": tasks_identity([str(t.task_id) for t in tasks], spec.num_shards,
                                            partition_hash([str(t.task_id) for t in tasks]))}
        plan = [((r, str(t.task_id)), str(getattr(t, "difficulty", ""))) for r in range(runs) for t in mine]
        resume = store.open(identity, plan)
        meta = {"env": cfg.env.name, "task_set": e.task_set, "num_tasks": len(tasks), "source": source,
                "best_of_n": e.best_of_n, "fork_budget": e.fork_budget, "retries": e.retries,
                "settings": {k: v for k, v in dataclasses.asdict(settings).items() if k != "cell_limits"},
                "policy": generator.describe() if hasattr(generator, "describe") else {"kind": "engine",
                                                                                         "source": source}}
        (out_dir / META).write_text(json.dumps(meta, indent=1, default=str) + "\n")
        todo = len(plan) - len(resume.done)
        if resume.done or resume.retry or resume.dropped_trees:
            say(f"sera-eval: resuming {store.directory}: {len(resume.done)} of {len(plan)} finished trees kept "
                f"(skipped), {resume.retry} errored to retry, {todo} to run"
                + (f"; {resume.dropped_trees} unfinished tree lines dropped" if resume.dropped_trees else "")
                + ("; a torn last line was cut" if resume.torn else ""))
        warm = None
        if engine is not None and todo:
            t0 = time.monotonic()
            warm = {"executables": engine.warmup(), "seconds": 0.0}  # nothing compiles while agents wait
            warm["seconds"] = time.monotonic() - t0
        warm_keys()
        if wrap_generator is not None:
            generator = wrap_generator(generator)
        if todo:
            pool = await start_pool(cfg.env.num_workers) if environment(cfg.env.name).needs_pool else None
        policy_record = meta["policy"]
        session = {"started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "shard": spec.shard_index,
                   "kept": len(resume.done), "retried": resume.retry, "concurrency": e.concurrency,
                   "warmup": warm, "runs": {}}
        for r in range(runs):
            left = [t for t in mine if (r, str(t.task_id)) not in resume.done]
            if not left:
                continue

            def keep(outcome: Outcome, rec: dict, trees: list, r: int = r) -> None:
                for tree in trees:
                    tree.misc["policy"] = policy_record
                store.append((r, outcome.task_id), {**rec, "success": outcome.success}, trees)

            watch = RunWatch(engine if engine is not None else generator)
            try:
                with tracing(watch.trace):
                    await evaluate_tasks(
                        left, cfg.env.name, generator, tokenizer, runtime_settings(cfg, evaluation=True, run_index=r),
                        retries=e.retries, concurrency=e.concurrency, selection=selection_settings(cfg), pool=pool,
                        run_index=r, textworld_rules=cfg.env.rules, on_task=keep,
                        progress=f"evaluation run {r + 1}/{runs}" if progress else None,
                        already=len(mine) - len(left))
            finally:
                session["runs"][str(r)] = {**watch.finish(), "tasks": len(left)}
                _append_session(store.directory, session)
            if on_run is not None:
                on_run(r, summarise([Outcome(k[1], rec["difficulty"], rec["success"])
                                     for k, rec in store.records().items() if k[0] == r], DIFFICULTY_ORDER))
        errored = sum(1 for rec in store.records().values() if rec.get("success") is None)
    finally:
        if pool is not None:
            await pool.close()
        if engine is not None:
            engine.close()
        if served is not None:
            await served.aclose()
        store.close()
    if spec.num_shards > 1:
        say(f"sera-eval: shard {spec.shard_index} of {spec.num_shards} complete in {store.directory}"
            + (f" with {errored} errored tree(s) (the same command retries them)" if errored else "")
            + f"; `sera-eval --aggregate {out_dir}` writes the report once every shard is")
        return None
    return aggregate(out_dir)


def _append_session(directory: Path, session: dict) -> None:
    """Records a session's figures (rewritten whole at each run's end: the last line is this session's)."""
    path = directory / SESSIONS
    lines = path.read_text().splitlines() if path.exists() else []
    if lines and json.loads(lines[-1]).get("started") == session["started"] and \
            json.loads(lines[-1]).get("shard") == session["shard"]:
        lines = lines[:-1]
    lines.append(json.dumps(session, default=str))
    tmp = path.with_suffix(".tmp")
    tmp.write_text("\n".join(lines) + "\n")
    tmp.replace(path)


def _sessions(directory: Path) -> list[dict]:
    path = directory / SESSIONS
    return [json.loads(ln) for ln in path.read_text().splitlines() if ln.strip()] if path.exists() else []


def aggregate(out_dir: str | Path) -> dict:
    """Writes the report of a complete pass (every shard's records) as report.json/.md, with every shard's trees in
    trees.jsonl, and returns it; raises UserError naming the shards that are missing or incomplete."""
    out_dir = Path(out_dir)
    identity, shards = collect(out_dir)
    meta_path = out_dir / META
    meta = json.loads(meta_path.read_text()) if meta_path.exists() else {}
    runs = int(identity["protocol"]["runs"])
    n = int(identity["tasks"]["num_shards"])
    records: dict = {}
    for recs in shards:
        records.update(recs)
    order = _task_order(out_dir, n)
    tables, by_game, finals, per_run = [], [], [], []
    for r in range(runs):
        recs = [dict(records[(r, t)], task_id=t) for t in order if (r, t) in records]
        outcomes = [Outcome(x["task_id"], x["difficulty"], x["success"]) for x in recs]
        tables.append(summarise(outcomes, DIFFICULTY_ORDER))
        if any(x.get("game") is not None for x in recs):
            by_game.append(summarise([Outcome(x["task_id"], str(x["game"]), x["success"]) for x in recs]))
        finals.append(tree_means([x.get("stats", {}) for x in recs]))
        per_run.append([{k: v for k, v in x.items() if k != "run"} for x in recs])
    sessions = [s for i in range(n) for s in _sessions(shard_dir(out_dir, n, i))]
    seconds = [max((sum(float(s["runs"].get(str(r), {}).get("seconds", 0.0)) for s in sessions if s["shard"] == i)
                    for i in range(n)), default=0.0) for r in range(runs)]
    efficiency = [{"run": int(r), "shard": s["shard"], "session": s["started"], **x}
                  for s in sessions for r, x in s["runs"].items()]
    warm = next((s["warmup"] for s in sessions if s.get("warmup")), None)
    rep = report(tables, **{k: meta.get(k) for k in ("env", "task_set", "num_tasks", "source", "best_of_n",
                                                      "fork_budget", "retries", "settings", "policy")},
                 concurrency=sessions[0]["concurrency"] if sessions else None, run_seconds=seconds,
                 tasks=per_run, by_game=by_game, tree_means=finals, efficiency=efficiency, warmup=warm,
                 shards=n, sessions=len(sessions), identity=identity,
                 created=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()))
    # Errored trees (their retries spent: a server that died, answered garbage, a crashing env) count as failures,
    # as the protocol says, but such a report is not the pass's result: it says so, and a rerun retries them.
    rep["errored"] = sum(int(t["overall"]["errored"]) for t in tables)
    rep["complete"] = rep["errored"] == 0
    merge_trees(out_dir)
    write_outputs(rep, out_dir)
    return rep


def _task_order(out_dir: Path, n: int) -> list[str]:
    """Returns the pass's task ids in the picked order (shard plans interleaved back: task i is in shard i mod n)."""
    plans = []
    for i in range(n):
        rows = json.loads((shard_dir(out_dir, n, i) / "plan.json").read_text())
        ids: list[str] = []
        for row in rows:
            if row["run"] == 0:
                ids.append(str(row["task_id"]))
        plans.append(ids)
    order: list[str] = []
    for j in range(max((len(p) for p in plans), default=0)):
        order.extend(p[j] for p in plans if j < len(p))
    return order
