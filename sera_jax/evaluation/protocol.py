"""``sera-eval``'s protocol: the paper's evaluation protocol on a task set (docs/design/algorithm.md §9–10,
docs/design/textworld.md §12). ``passes.py`` runs it as a resumable, sharded pass for any policy.

Protocol, per run: one tree per task at temperature 0 (``eval.temperature``), per-agent step limit
``eval.max_steps``, depth ``env.max_depth``, the evaluation prompt/context/completion caps of the ``eval`` section,
``eval.concurrency`` trees at a time; a rollout whose record says it failed (tree error, or the root agent ended with
an error such as a generator or env-worker failure) — or whose runner raised — is run again, ``eval.retries`` times
(1), and still failing it counts as a failure (``Outcome.success = None``; never an abort). Success is the root's
programmatic label. ``eval.best_of_n > 1`` turns on test-time selection (N candidates per delegation, strict fork
budget ``eval.fork_budget``). R runs (``eval.num_runs``) give mean ± sample std per difficulty and overall.

Outputs in ``out_dir``: ``report.json`` (``evaluate.report`` plus per-task attempts, per-game tables for TextWorld
and mean tree statistics of the final attempts), ``report.md`` and
``trees.jsonl`` (every attempt's tree, appended as each task finishes; ``tree.misc["eval"]`` = run, attempt, error,
success).
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import sys
import time
from pathlib import Path
from typing import Any, Callable, Sequence

import jax
from tqdm import tqdm

from sera_jax.agents.efficiency import RunWatch, efficiency_line
from sera_jax.agents.keys import warm_keys
from sera_jax.agents.env_name import EnvName
from sera_jax.agents.environments import environment
from sera_jax.agents.launchers.factory import make_launcher_factory
from sera_jax.agents.phases import tracing
from sera_jax.agents.records import Tree, write_jsonl
from sera_jax.agents.roles import RoleCallers
from sera_jax.agents.runtime import run_tree, start_pool
from sera_jax.agents.settings import RuntimeSettings
from sera_jax.assembly.engines import engine_config
from sera_jax.assembly.roles import selector_judge
from sera_jax.assembly.settings import runtime_settings
from sera_jax.assembly.tasks import load_env_tasks
from sera_jax.assembly.tokenizer import resolve_tokenizer
from sera_jax.config import RunConfig
from sera_jax.evaluation.report import (
    DIFFICULTY_ORDER,
    Outcome,
    pick_tasks,
    report,
    summarise,
    tree_error,
    tree_success,
)
from sera_jax.model import init_params, load_pretrained
from sera_jax.model.tokenizer import load_tokenizer
from sera_jax.parallel.hosts import Exchange, deal_ranks
from sera_jax.parallel.mesh import MeshConfig, make_mesh
from sera_jax.sampling import Engine
from sera_jax.training.checkpoint import Checkpointer, checkpoint_dir
from sera_jax.training.intact import restore_newest_intact
from sera_jax.warmstart.sft import shipped_dir, shipped_matches

__all__ = ["Policy", "load_policy", "load_eval_tasks", "run_task", "selection_settings",
           "evaluate_tasks", "evaluate_distributed", "tree_means", "write_outputs"]


def _line_to_stderr(line: str) -> None:
    """Writes one line to stderr in a single write: orbax's reader threads, failing on a torn checkpoint as the
    process goes on, print their tracebacks meanwhile, and ``print``'s separate newline let one land mid-line."""
    sys.stderr.write(line + "\n")
    sys.stderr.flush()


@dataclasses.dataclass
class Policy:
    """What generates: model config, parameters, tokenizer (and where they came from)."""

    model_cfg: Any
    params: Any
    tokenizer: Any
    tokenizer_path: str
    source: str


def load_policy(cfg: RunConfig, *, checkpoint: str | Path | None = None, hf_dir: str | Path | None = None,
                version: int | None = None) -> Policy:
    """Returns the Policy to evaluate: a run checkpoint's params (its metadata's model config and tokenizer), a HF
    directory's, or else ``cfg``'s model: ``model.hf_dir``; ``model.init_from``'s newest checkpoint, or the shipped
    warm start when ``cfg``'s warm-start recipe is the shipped one (the tiny default: what its training starts from);
    else a random init from ``train.seed`` with ``cfg``'s tokenizer."""

    if checkpoint is not None and hf_dir is not None:
        raise ValueError("give a checkpoint or a HF directory, not both")
    if checkpoint is not None:
        ck_dir = checkpoint_dir(checkpoint)
        ck = Checkpointer(ck_dir)
        try:
            # The newest intact version unless one is asked for: a torn newer one is reported in one line and
            # passed over (train.checkpoint_fallback=false / --no-fallback refuses; sera_jax.training.intact).
            model_cfg, params, meta = ck.restore_model(version) if version is not None else restore_newest_intact(
                ck.manager.all_steps(), ck.restore_model, directory=str(ck.directory),
                fallback=cfg.train.checkpoint_fallback, log=_line_to_stderr)[1]
        finally:
            ck.close()
        tok_path = meta.get("tokenizer_path")
        if tok_path and Path(tok_path).exists():
            return Policy(model_cfg, params, load_tokenizer(tok_path), str(tok_path),
                          f"checkpoint {ck_dir} version {meta.get('version')}")
        tok, tok_path = resolve_tokenizer(cfg.model.tokenizer, cfg.model.hf_dir)
        return Policy(model_cfg, params, tok, str(tok_path), f"checkpoint {ck_dir} version {meta.get('version')}")
    hf = hf_dir if hf_dir is not None else cfg.model.hf_dir
    if hf is not None:
        m = cfg.model
        model_cfg, params = load_pretrained(hf, param_dtype=m.param_dtype, dtype=m.dtype)
        has_tok = any((Path(hf) / n).is_file() for n in ("tokenizer.json", "tokenizer.model"))
        spec = str(hf) if has_tok or cfg.model.tokenizer is None else cfg.model.tokenizer
        tok, tok_path = resolve_tokenizer(spec, str(hf))
        return Policy(model_cfg, params, tok, str(tok_path), f"hf {hf}")
    init_from = Path(cfg.model.init_from) if cfg.model.init_from is not None else None
    if init_from is not None and (init_from / "checkpoints").is_dir():
        return load_policy(cfg, checkpoint=init_from)   # e.g. a built warm start
    if init_from is not None and shipped_matches(cfg):
        return load_policy(cfg, hf_dir=shipped_dir(cfg))  # the shipped warm start of its recipe
    model_cfg = cfg.model_config()
    tok, tok_path = resolve_tokenizer(cfg.model.tokenizer, None)
    params = init_params(jax.random.fold_in(jax.random.key(cfg.train.seed), 0), model_cfg)
    return Policy(model_cfg, params, tok, str(tok_path), f"random init (preset {cfg.model.preset}, "
                                                           f"seed {cfg.train.seed})")


def load_eval_tasks(cfg: RunConfig, num_tasks: int | None = None) -> list:
    """Returns the tasks of ``eval.task_set`` of ``eval.difficulties`` (default all; ``env.difficulties`` selects
    training tasks only),
    ``num_tasks`` of them picked round-robin over difficulties when given."""

    env = dataclasses.replace(cfg.env, task_set=cfg.eval.task_set, difficulties=tuple(cfg.eval.difficulties))
    tasks, _ = load_env_tasks(dataclasses.replace(cfg, env=env))
    return pick_tasks(tasks, num_tasks)


async def run_task(task: Any, env: EnvName, generator: Any, tokenizer: Any, settings: RuntimeSettings, *,
                   retries: int = 1, selection: dict | None = None, pool: Any = None, run_index: int = 0,
                   textworld_rules: str = "reference") -> tuple[Outcome, dict, list[Tree]]:
    """Runs one task's tree, again up to ``retries`` times while it fails; returns (Outcome, a record of the
    attempts {task_id, difficulty, game, attempts, errors, success, stats of the last attempt's tree}, every
    attempt's Tree)."""
    factory = make_launcher_factory("evaluation", None, env, selection=selection, settings=settings)
    trees: list[Tree] = []
    errors: list[str] = []
    task_id, difficulty = str(task.task_id), str(getattr(task, "difficulty", ""))
    game = getattr(task, "game", None)  # TextWorld's task family (the reference also reports per game)
    for attempt in range(retries + 1):
        tree = None
        try:
            tree = await run_tree(task, env, generator, tokenizer, settings, rollout_index=attempt, pool=pool,
                                  launcher=factory(task, attempt), tree_id=f"{task_id}#run{run_index}.{attempt}",
                                  textworld_rules=textworld_rules)
            tree = (await factory.finalize([tree]))[0]
            err = tree_error(tree)
        except asyncio.CancelledError:
            raise
        except Exception as e:  # noqa: BLE001  (a rollout that raises is retried, then counted as a failure)
            err = f"{type(e).__name__}: {e}"
        success = tree is not None and err is None and tree_success(tree)
        if tree is not None:
            tree.misc["eval"] = {"run": run_index, "attempt": attempt, "error": err, "success": success}
            trees.append(tree)
        if err is None:
            return (Outcome(task_id, difficulty, success),
                    {"task_id": task_id, "difficulty": difficulty, "game": game, "attempts": attempt + 1,
                     "errors": errors, "success": success, "stats": tree.misc.get("stats", {})}, trees)
        errors.append(err)
    return (Outcome(task_id, difficulty, None),
            {"task_id": task_id, "difficulty": difficulty, "game": game, "attempts": retries + 1, "errors": errors,
             "success": None, "stats": trees[-1].misc.get("stats", {}) if trees else {}}, trees)


async def evaluate_tasks(tasks: Sequence[Any], env: EnvName, generator: Any, tokenizer: Any, settings: RuntimeSettings,
                         *, retries: int = 1, concurrency: int = 64, selection: dict | None = None, pool: Any = None,
                         run_index: int = 0, textworld_rules: str = "reference",
                         on_trees: Callable[[list[Tree]], None] | None = None,
                         on_task: Callable[[Outcome, dict, list[Tree]], None] | None = None,
                         progress: str | None = None, already: int = 0
                         ) -> tuple[list[Outcome], list[dict], list[Tree]]:
    """Runs every task (at most ``concurrency`` at a time) under :func:`run_task`; returns (outcomes, attempt
    records, trees), in task order. With ``on_trees`` each task's trees go there as soon as it finishes and are not
    kept (a full task set's prompts would not fit in memory); the returned tree list is then empty. ``on_task``
    takes (outcome, record, trees) the moment each task ends, and its trees are not kept either (``passes.py``
    stores them there). ``progress`` names a progress bar on stderr (tasks done of all, successes so far), which
    starts at ``already`` tasks (a resumed pass's finished ones) out of ``already + len(tasks)``."""
    gate = asyncio.Semaphore(concurrency)
    bar = (tqdm(total=already + len(tasks), initial=already, desc=progress, unit="task", leave=False,
                dynamic_ncols=True) if progress is not None else None)
    solved = 0

    async def one(task):
        async with gate:
            outcome, rec, trees = await run_task(task, env, generator, tokenizer, settings, retries=retries,
                                                 selection=selection, pool=pool, run_index=run_index,
                                                 textworld_rules=textworld_rules)
        if on_trees is not None:
            on_trees(trees)
            trees = []
        if on_task is not None:
            on_task(outcome, rec, trees)
            trees = []
        if bar is not None:
            nonlocal solved
            solved += bool(outcome.success)
            bar.set_postfix(success=f"{solved}/{bar.n + 1 - already}", refresh=False)
            bar.update(1)
        return outcome, rec, trees

    try:
        results = await asyncio.gather(*(one(t) for t in tasks))
    finally:
        if bar is not None:
            bar.refresh()  # the final count is drawn even when the last tasks ended within tqdm's redraw interval
            bar.close()
    return [r[0] for r in results], [r[1] for r in results], [t for r in results for t in r[2]]


def selection_settings(cfg: RunConfig) -> dict | None:
    """Returns test-time selection's settings (``eval.best_of_n`` > 1), or None: N, the fork budget, and the rubric
    and scoring caps — the method section's when set (the tiny default's fit its 1,024-token context), else the
    selector's own (1,024 / 512, docs/design/recipes.md §4)."""
    e = cfg.eval
    if e.best_of_n <= 1:
        return None
    caps = {k: v for k in ("max_rubric_tokens", "max_scoring_tokens") if (v := getattr(cfg.method, k)) is not None}
    # An endpoint selector is the reference's oracle mode: its binary judge picks the first success (no rubric).
    oracle = selector_judge(cfg)
    return {"n": e.best_of_n, "fork_budget": e.fork_budget, **caps,
            **({"roles": RoleCallers(selector_judge=oracle)} if oracle is not None else {})}


async def evaluate_distributed(cfg: RunConfig, *, out_dir: str | Path, checkpoint: str | Path | None = None,
                   hf_dir: str | Path | None = None, version: int | None = None, num_tasks: int | None = None,
                   num_runs: int | None = None, generator: Any = None, tokenizer: Any = None,
                   wrap_generator: Callable[[Any], Any] | None = None,
                   on_run: Callable[[int, dict], None] | None = None, progress: bool = False) -> dict:
    """Evaluates a policy under the protocol of the module docstring in one pass, its task set split over a
    multi-host job's processes (``passes.evaluate`` calls it under ``jax.distributed``; a pass of one process is
    ``passes.evaluate``'s, resumable and sharded); writes report.json, report.md and trees.jsonl into ``out_dir``
    and returns the report (``evaluate.report`` + env, task set, source, settings, per-run task records).

    ``generator``/``tokenizer`` replace the model (a test double); otherwise an Engine serves ``load_policy``'s
    params. ``wrap_generator`` wraps whichever generator is used (e.g. to inject failures).
    """
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    e = cfg.eval
    tasks = load_eval_tasks(cfg, num_tasks)
    all_tasks = len(tasks)
    runs = e.num_runs if num_runs is None else num_runs
    # A multi-host job splits the task set: each process runs a contiguous share on its own engine, env workers and
    # sandboxes; the outcomes are gathered in task order and process 0 writes the one report.
    exchange = Exchange("eval") if jax.process_count() > 1 else None
    if exchange is not None:
        tasks = [tasks[i] for i in deal_ranks(len(tasks))]
    engine, source, warm = None, "generator", None
    if generator is None:
        policy = load_policy(cfg, checkpoint=checkpoint, hf_dir=hf_dir, version=version)
        if policy.tokenizer.vocab_size > policy.model_cfg.vocab_size:
            raise ValueError(f"tokenizer {policy.tokenizer_path} has {policy.tokenizer.vocab_size} tokens, more "
                             f"than the model's vocab_size {policy.model_cfg.vocab_size}")
        dtype = "bfloat16" if jax.default_backend() == "gpu" else policy.model_cfg.dtype
        engine = Engine(policy.model_cfg, policy.params, engine_config(cfg, dtype, evaluation=True,
                                                                 model_cfg=policy.model_cfg),
                        tokenizer=policy.tokenizer, mesh=make_mesh(MeshConfig(1, 1, 1), jax.local_devices()[:1]),
                        seed=cfg.train.seed)
        generator, tokenizer, source = engine, policy.tokenizer, policy.source
        t0 = time.monotonic()
        warm = {"executables": engine.warmup()}  # every shape now: nothing is traced or compiled while agents wait
        warm["seconds"] = time.monotonic() - t0
    warm_keys()  # the turns' key derivations (small programs, compiled once per process)
    if wrap_generator is not None:
        generator = wrap_generator(generator)
    env = cfg.env.name
    selection = selection_settings(cfg)
    pool = await start_pool(cfg.env.num_workers) if environment(env).needs_pool else None
    tables, by_game, finals, records, times, efficiency = [], [], [], [], [], []
    trees_path = out_dir / ("trees.jsonl" if exchange is None else f"trees.p{jax.process_index()}.jsonl")
    trees_path.write_text("")
    try:
        for r in range(runs):
            watch = RunWatch(engine if engine is not None else generator)
            with tracing(watch.trace):
                outcomes, recs, trees = await evaluate_tasks(
                    tasks, env, generator, tokenizer, runtime_settings(cfg, evaluation=True, run_index=r),
                    retries=e.retries,
                    concurrency=e.concurrency, selection=selection, pool=pool, run_index=r,
                    textworld_rules=cfg.env.rules, on_trees=lambda trees: write_jsonl(trees, trees_path),
                    progress=f"evaluation run {r + 1}/{runs}" if progress else None)
            efficiency.append(watch.finish())
            if watch.traced:
                efficiency[-1]["traced_functions"] = watch.traced
            if exchange is not None:
                outcomes, recs, efficiency[-1] = gather_run(exchange, outcomes, recs, efficiency[-1])
            times.append(efficiency[-1]["seconds"])
            tables.append(summarise(outcomes, DIFFICULTY_ORDER))
            if any(rec["game"] is not None for rec in recs):
                by_game.append(summarise([dataclasses.replace(o, difficulty=str(rec["game"]))
                                          for o, rec in zip(outcomes, recs)]))
            finals.append(tree_means([rec["stats"] for rec in recs]))
            records.append(recs)
            if on_run is not None:
                on_run(r, tables[-1])
    finally:
        if pool is not None:
            await pool.close()
        if engine is not None:
            engine.close()
    settings = dataclasses.asdict(runtime_settings(cfg, evaluation=True))
    rep = report(tables, env=env, task_set=e.task_set, num_tasks=all_tasks, source=source,
                 best_of_n=e.best_of_n, fork_budget=e.fork_budget, retries=e.retries, concurrency=e.concurrency,
                 settings={k: v for k, v in settings.items() if k != "cell_limits"}, run_seconds=times,
                 tasks=records, by_game=by_game, tree_means=finals, created=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                 efficiency=efficiency, warmup=warm)
    if exchange is not None:
        rep["processes"] = jax.process_count()
        exchange.barrier("eval-trees")  # every process's tree file is complete
        if jax.process_index() == 0:
            merge_tree_files(out_dir, jax.process_count())
    if jax.process_index() == 0:
        write_outputs(rep, out_dir)
    return rep


def gather_run(exchange: Exchange, outcomes: Sequence[Outcome], recs: Sequence[dict], eff: dict
               ) -> tuple[list[Outcome], list[dict], dict]:
    """Returns one evaluation run's outcomes and task records from every process (task order: each process ran a
    contiguous share) and the run's efficiency: the slowest process's seconds, token sums, each process's own
    ``completion_tokens`` and ``engine_busy_fraction`` under ``processes``."""
    got = exchange.allgather({"outcomes": [dataclasses.asdict(o) for o in outcomes], "recs": list(recs),
                              "eff": {k: v for k, v in eff.items() if isinstance(v, (int, float))}}, "eval-run")
    effs = [g["eff"] for g in got]
    merged = dict(effs[0])
    merged["seconds"] = max(x.get("seconds", 0.0) for x in effs)
    for k in ("completion_tokens", "traces", "compiles", "engine_compiles"):
        if k in merged:
            merged[k] = sum(x.get(k, 0) for x in effs)
    if "completion_tokens" in merged and merged["seconds"] > 0:
        merged["completion_tokens_per_s"] = merged["completion_tokens"] / merged["seconds"]
    if "engine_busy_fraction" in merged:
        merged["engine_busy_fraction"] = sum(x.get("engine_busy_fraction", 0.0) for x in effs) / len(effs)
    merged["processes"] = effs
    return ([Outcome(**o) for g in got for o in g["outcomes"]], [r for g in got for r in g["recs"]], merged)


def merge_tree_files(out_dir: Path, processes: int) -> None:
    """Concatenates the processes' ``trees.p<i>.jsonl`` into ``trees.jsonl`` (process order) and removes them."""
    with open(out_dir / "trees.jsonl", "w") as out:
        for p in range(processes):
            part = out_dir / f"trees.p{p}.jsonl"
            with open(part) as f:
                for line in f:
                    out.write(line)
            part.unlink()


def tree_means(stats: Sequence[dict]) -> dict[str, float]:
    """Returns the mean over trees of each count in their ``tree.misc["stats"]`` (nodes, turns, completion tokens,
    delegations, ...; see ``runtime.tree_stats``)."""
    keys = sorted({k for s in stats for k in s})
    return {k: sum(float(s.get(k, 0)) for s in stats) / len(stats) for k in keys} if stats else {}


def write_outputs(rep: dict, out_dir: str | Path) -> dict[str, str]:
    """Writes report.json and report.md (replacing earlier ones); returns their paths by name."""
    out_dir = Path(out_dir)
    paths = {"report": out_dir / "report.json", "markdown": out_dir / "report.md"}
    paths["report"].write_text(json.dumps(rep, indent=1, default=str, allow_nan=True) + "\n")
    overall = rep["mean_std"]["overall"]
    head = (f"# sera-eval: {rep['env']} / {rep['task_set']} ({rep['num_tasks']} tasks, {rep['num_runs']} run"
            f"{'s' if rep['num_runs'] > 1 else ''})\n\nPolicy: {rep['source']}. Overall success "
            f"{overall[0]:.2f} ± {overall[1]:.2f} % (sample std; errors count as failures).\n\n")
    if rep.get("errored"):
        head += (f"**Incomplete**: {rep['errored']} tree(s) errored and are counted as failures above; rerunning "
                 "the same command retries them.\n\n")
    eff = "".join(f"\nRun {i + 1}: {efficiency_line(x)}." for i, x in enumerate(rep.get("efficiency") or []))
    warm = rep.get("warmup")
    if warm:
        eff = f"\nEngine warm-up: {warm['executables']} executables in {warm['seconds']:.1f} s." + eff
    paths["markdown"].write_text(head + rep["markdown"] + "\n" + (eff + "\n" if eff else ""))
    return {k: str(v) for k, v in paths.items()}
