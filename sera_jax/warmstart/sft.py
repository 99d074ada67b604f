"""``sera-warmstart``: supervised fine-tuning on oracle demonstrations, so a tiny policy can act, delegate, write a
parseable rubric and score its children before RL starts.

Demonstrations come from the real runtime: ``oracle.TextCraftOracle`` plays the policy through a recording
``ScriptedGenerator`` on the run's own tasks, env workers and sandboxes, under the SERA execution-stage launcher (a
rubric before every delegation, a score after every child). What is recorded is exactly the token stream the engine
would see: each agent turn's prompt as sent and its completion, each rubric and score call. Datums (prefix-merged,
completion tokens trained) are kept for agents that played the gold plan (succeeded, or failed only through a
sabotaged descendant), every rubric, and every score (the oracle's scores are the true outcomes, sabotaged children
included). They are trained with the run's own ``train_step`` — the ``pg`` loss with advantage 1 is token-mean
negative log-likelihood — for a fixed budget of updates (``warmstart.steps``), and saved as an orbax checkpoint that
``model.init_from`` loads.

TextWorld-Sync has its own oracle and demonstrations (``textworld_oracle.py``, ``textworld_demos.py``: the same
runtime, the shared world, rubrics, scores, counterfactual branches and the ``policy_frozen`` judge's requests);
``warm_start`` picks them by ``env.name``.

The package ships the tiny defaults' warm starts (``assets/tiny_warmstart`` for TextCraft, 3.7 MB, and
``assets/tiny_textworld_warmstart`` for TextWorld: HF-format weights and ``warmstart.json`` recording the recipe it
was built from and its numbers), because building one takes longer than the 15-minute budget of a default run on 2
cores. ``warm_start`` uses it only when the recipe — model,
tokenizer, prompts, env caps and every ``warmstart`` field — equals the config's; otherwise it builds.
``sera-warmstart --ship`` rebuilds it from scratch and rewrites the asset.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import random
import time
from pathlib import Path
from typing import Any, Sequence

import jax

from sera_jax.agents import environments
from sera_jax.assembly.tasks import load_env_tasks
from sera_jax.assembly.tokenizer import ASSETS, BUILTIN, BUILTIN_PREFIX, resolve_tokenizer
from sera_jax.config import check_mesh
from sera_jax.model import init_params, load_pretrained, save_pretrained
from sera_jax.parallel.mesh import make_mesh
from sera_jax.rl.batch import first_fit_decreasing, pack_datums
from sera_jax.rl.datums import Datum
from sera_jax.rl.losses import StepConfig
from sera_jax.rl.optim import OptimConfig, make_optimizer
from sera_jax.rl.shapes import bucket_length, rows_per_micro_batch
from sera_jax.training.checkpoint import Checkpointer, make_meta, sha256_file
from sera_jax.training.step import (
    batch_axis_size,
    init_train_state,
    make_train_step,
    shard_train_state,
    stack_micro_batches,
)

# Each environment's shipped warm start (its registration's ``shipped_warmstart``, agents.environments).
SHIPPED_DIRS = {n: ASSETS / d for n in environments.names() if (d := environments.environment(n).shipped_warmstart)}
SHIPPED_DIR = SHIPPED_DIRS[environments.DEFAULT_ENV]  # the tiny default's (TextCraft's)


def shipped_dir(cfg: Any) -> Path:
    """Returns the shipped warm-start directory of ``cfg``'s environment."""
    return SHIPPED_DIRS[cfg.env.name]


def demo_env(cfg: Any) -> Any:
    """Returns ``cfg.env`` with the demo tasks' set, difficulties and step limit (``warmstart.demo_task_set`` /
    ``demo_difficulties`` / ``demo_max_steps`` where given, else the RL tasks')."""
    ws, e = cfg.warmstart, cfg.env
    return dataclasses.replace(
        e, task_set=ws.demo_task_set if ws.demo_task_set is not None else e.task_set,
        difficulties=ws.demo_difficulties if ws.demo_difficulties is not None else e.difficulties,
        max_steps=ws.demo_max_steps if ws.demo_max_steps is not None else e.max_steps)


def recipe(cfg: Any) -> dict[str, Any]:
    """Returns what determines a warm start: the architecture, the tokenizer file's sha256, the prompt style and
    env caps the demos are played under, every ``warmstart`` field (seeds included) and the version
    of the oracle's demonstrations."""

    tok = cfg.model.tokenizer
    name = tok[len(BUILTIN_PREFIX):] if tok and tok.startswith(BUILTIN_PREFIX) else None
    tok_sha = sha256_file(str(BUILTIN[name])) if name in BUILTIN else tok
    ws = {k: v for k, v in dataclasses.asdict(cfg.warmstart).items()
          if k not in ("enabled", "out_dir", "demo_task_set", "demo_difficulties", "demo_max_steps")}  # under "env"
    if not ws["exhaust_share"]:  # named only when on, so recipes from before the setting stay valid
        del ws["exhaust_share"]
    if ws["rubric_target_prob"] == 1.0:  # likewise
        del ws["rubric_target_prob"], ws["rubric_miss"]
    if ws["batching"] == "mixed":  # likewise
        del ws["batching"]
    if not ws["decay"]:  # likewise
        del ws["decay"]
    if ws["copy_task_set"] is None:  # likewise
        del ws["copy_task_set"]
    if ws["child_rule"] == "greedy":  # likewise
        del ws["child_rule"]
    e, r, demo = cfg.env, cfg.rollout, demo_env(cfg)
    env = environments.environment(e.name)
    if env.warmstart_recipe is not None:  # what else shapes its demos (TextWorld: world rules, fork groups, caps)
        ws["play"] = env.get("warmstart_recipe")(cfg)
    return json.loads(json.dumps({
        "model": dataclasses.asdict(cfg.model_config()), "tokenizer": tok_sha,
        # The demo tasks' set (see demo_env): whether they are also the RL tasks does not change the warm start.
        "env": {"name": e.name, "task_set": demo.task_set, "difficulties": list(demo.difficulties),
                "max_steps": demo.max_steps, "max_depth": e.max_depth, "prompt_style": e.prompt_style,
                # Named only when on, so recipes (and shipped warm starts) from before the setting stay valid.
                **({"token_history": True} if e.token_history else {})},
        "rollout": {"max_completion_tokens": r.max_completion_tokens, "max_prompt_tokens": r.max_prompt_tokens,
                    "context_tokens": r.context_tokens},
        "method": cfg.method.name, "buckets": list(cfg.batch.buckets), "warmstart": ws,
        "demo_version": env.get("demo_version")}))


RECORD_NAME = "warmstart_recipe.json"  # in a warm-start run directory: the recipe it holds and its origin


def shipped_matches(cfg: Any, directory: Path | None = None) -> bool:
    """Returns whether the shipped warm start (``directory``, default ``shipped_dir(cfg)``) was built from ``cfg``'s
    recipe."""
    record = (directory or shipped_dir(cfg)) / "warmstart.json"
    return record.is_file() and json.loads(record.read_text()).get("recipe") == recipe(cfg)


def ship(cfg: Any, run_dir: str | Path, directory: Path | None = None) -> Path:
    """Writes the warm start in ``run_dir`` as the shipped asset (HF-format weights + ``warmstart.json``) in
    ``directory`` (default ``shipped_dir(cfg)``); returns the directory."""
    directory = directory or shipped_dir(cfg)
    ck = Checkpointer(Path(run_dir) / "checkpoints")
    try:
        model_cfg, params, meta = ck.restore_model()
    finally:
        ck.close()
    directory.mkdir(parents=True, exist_ok=True)
    save_pretrained(model_cfg, params, directory)
    (directory / "warmstart.json").write_text(json.dumps(
        {"recipe": recipe(cfg), "stats": meta.get("warmstart", {}), "provenance": meta.get("run", {})},
        indent=1, sort_keys=True) + "\n")
    return directory


def _import_shipped(cfg: Any, ck: Any, tok_path: str, directory: Path) -> None:
    model_cfg, params = load_pretrained(directory)
    record = json.loads((directory / "warmstart.json").read_text())
    meta = make_meta(cfg.to_dict(), model_cfg, tokenizer_path=tok_path)
    meta["warmstart"] = {**record.get("stats", {}), "source": f"shipped ({directory})"}
    ck.save(0, init_train_state(params, make_optimizer(OptimConfig())), meta, force=True)
    ck.wait()


def _batches_by_length(datums: Sequence[Datum], token_budget: int, steps: int, seed: int,
                       buckets: Sequence[int]):
    """Yields ``steps`` lists of datums, each from one length bucket and filling at most one micro-batch of it
    (``token_budget // T`` rows of T positions, by ``pack_datums``' first fit decreasing): every epoch shuffles each bucket's
    datums, cuts them into such batches and shuffles the batches of all buckets together. A short datum then costs
    a short row's attention instead of sharing an update (and its padding) with the longest one."""
    rng = random.Random(seed)
    by_bucket: dict[int, list[Datum]] = {}
    for d in datums:
        if len(d.tokens) > 1:
            by_bucket.setdefault(bucket_length(len(d.tokens) - 1, buckets), []).append(d)
    if not by_bucket:
        raise ValueError("warm start: no datum has a target token")
    yielded = 0
    while True:
        epoch: list[list[Datum]] = []
        for T in sorted(by_bucket):
            group = list(by_bucket[T])
            rng.shuffle(group)
            rows, batch, lengths = rows_per_micro_batch(token_budget, T), [], []
            for d in group:
                if batch and len(first_fit_decreasing(lengths + [len(d.tokens) - 1], T)[1]) > rows:
                    epoch.append(batch)
                    batch, lengths = [], []
                batch.append(d)
                lengths.append(len(d.tokens) - 1)
            epoch.append(batch)
        rng.shuffle(epoch)
        for batch in epoch:
            if yielded == steps:
                return
            yield batch
            yielded += 1


def _batches(datums: Sequence[Datum], token_budget: int, steps: int, seed: int):
    """Yields ``steps`` lists of datums (shuffled epochs), each holding about ``token_budget`` tokens."""
    rng = random.Random(seed)
    order: list[int] = []
    for _ in range(steps):
        batch, tokens = [], 0
        while True:
            if not order:
                order = list(range(len(datums)))
                rng.shuffle(order)
            d = datums[order[-1]]
            if batch and tokens + len(d.tokens) > token_budget:
                break
            batch.append(d)
            tokens += len(d.tokens)
            order.pop()
        yield batch


def warm_start(cfg: Any, out_dir: str | Path | None = None, *, log=print, use_shipped: bool = True,
               snapshot_every: int = 0) -> Path:
    """Builds the warm-start checkpoint of ``cfg`` (``cfg.warmstart``) in ``out_dir`` (default
    ``warmstart.out_dir``); returns the directory. Does nothing when it already holds a checkpoint of ``cfg``'s
    recipe (recorded in ``RECORD_NAME``; with ``use_shipped`` False, one built here, not copied); a checkpoint of any
    other recipe is moved aside to ``<out_dir>.stale-<time>``. Copies the shipped warm start there when
    ``use_shipped`` and its recipe is ``cfg``'s. ``snapshot_every`` > 0 also saves the
    parameters every that many updates under ``snapshots/step_N`` (to choose a budget)."""

    ws = cfg.warmstart
    out = Path(out_dir or ws.out_dir)
    record = out / RECORD_NAME
    if (out / "checkpoints").is_dir():
        have = json.loads(record.read_text()) if record.is_file() else {}
        if have.get("recipe") == recipe(cfg) and (use_shipped or have.get("origin") == "built"):
            log(f"warm start: using the checkpoint in {out}")
            return out
        # Another recipe (or one not recorded, or a shipped copy when a build is asked for): kept, moved aside.
        stale = out.with_name(f"{out.name}.stale-{time.strftime('%Y%m%d-%H%M%S')}")
        out.rename(stale)
        why = "a copy of the shipped warm start" if have.get("recipe") == recipe(cfg) else "another recipe"
        log(f"warm start: {out} holds {why}; moved to {stale}, replacing it")
    ck = Checkpointer(out / "checkpoints", every=1, keep=1)
    try:
        out.mkdir(parents=True, exist_ok=True)
        t0 = time.monotonic()
        tokenizer, tok_path = resolve_tokenizer(cfg.model.tokenizer, cfg.model.hf_dir)
        if use_shipped and shipped_matches(cfg):
            _import_shipped(cfg, ck, tok_path, shipped_dir(cfg))
            record.write_text(json.dumps({"recipe": recipe(cfg), "origin": "shipped"}) + "\n")
            log(f"warm start: the shipped one ({shipped_dir(cfg).name}, built by `sera-warmstart --ship` from this "
                f"config's recipe) copied to {out}")
            return out
        tasks, files = load_env_tasks(dataclasses.replace(cfg, env=demo_env(cfg)))
        tasks = random.Random(ws.seed).sample(list(tasks), min(ws.demo_tasks, len(tasks)))
        collect = environments.environment(cfg.env.name).get("warmstart_oracle")  # its demo oracle
        datums, stats = asyncio.run(collect(dataclasses.replace(cfg, env=demo_env(cfg)), tokenizer, tasks))
        if not datums:
            raise RuntimeError("warm start: the oracle produced no demonstration "
                               "(check env.task_set, or warmstart.demo_task_set)")
        longest = max(len(d.tokens) for d in datums)
        datums = [d for d in datums if len(d.tokens) - 1 <= max(cfg.batch.buckets)]
        stats.update(collect_s=round(time.monotonic() - t0, 1), longest_datum=longest)
        log("warm start demos: " + json.dumps(stats))

        check_mesh(cfg, jax.device_count())
        mesh = make_mesh(cfg.mesh)
        model_cfg = cfg.model_config()
        params = init_params(jax.random.fold_in(jax.random.key(ws.init_seed), 0), model_cfg)
        tx = make_optimizer(OptimConfig(lr=ws.lr, warmup_steps=ws.warmup_steps, weight_decay=0.0,
                                        decay_steps=ws.steps - ws.warmup_steps if ws.decay else None))
        state = shard_train_state(params, tx, model_cfg, mesh)
        step_fn = make_train_step(model_cfg, tx, StepConfig(loss="pg"), mesh=mesh, state=state)
        ranks = batch_axis_size(mesh)
        history = []
        from tqdm import tqdm

        with open(out / "warmstart_metrics.jsonl", "w") as fh:
            batches = (_batches_by_length(datums, ws.token_budget, ws.steps, ws.seed, cfg.batch.buckets)
                       if ws.batching == "by_length" else _batches(datums, ws.token_budget, ws.steps, ws.seed))
            for i, batch in enumerate(tqdm(batches, total=ws.steps,
                                           desc="warm start (SFT)", unit="step", dynamic_ncols=True)):
                packed = pack_datums(batch, token_budget=ws.token_budget, buckets=cfg.batch.buckets)
                mb = stack_micro_batches(packed.micro_batches, row_multiple=ranks)
                state, m = step_fn(state, mb)
                row = {"step": i + 1, "nll": float(m["loss"]), "grad_norm": float(m["grad_norm"]),
                       "tokens": int(packed.num_tokens), "datums": len(batch)}
                history.append(row)
                fh.write(json.dumps(row) + "\n")
                if snapshot_every and (i + 1) % snapshot_every == 0 and i + 1 < ws.steps:
                    snap = Checkpointer(out / "snapshots" / f"step_{i + 1}" / "checkpoints", every=1, keep=1)
                    snap.save(0, state, make_meta(cfg.to_dict(), model_cfg, tokenizer_path=tok_path), force=True)
                    snap.wait()
                    snap.close()
        meta = make_meta(cfg.to_dict(), model_cfg, tokenizer_path=tok_path, data_files=files)
        meta["warmstart"] = {**stats, "steps": ws.steps, "lr": ws.lr, "token_budget": ws.token_budget,
                             "final_nll": history[-1]["nll"] if history else None,
                             "seconds": round(time.monotonic() - t0, 1)}
        ck.save(0, state, meta, force=True)
        ck.wait()
        record.write_text(json.dumps({"recipe": recipe(cfg), "origin": "built"}) + "\n")
        log(f"warm start: {ws.steps} SFT steps, NLL {history[0]['nll']:.3f} -> {history[-1]['nll']:.3f}, "
            f"{time.monotonic() - t0:.0f} s; checkpoint in {out}")
        return out
    finally:
        ck.close()
