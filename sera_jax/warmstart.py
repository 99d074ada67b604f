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

The package ships the tiny default's warm start (``assets/tiny_warmstart``: HF-format weights, 3.7 MB, and
``warmstart.json`` recording the recipe it was built from and its numbers), because building it takes longer than
the 15-minute budget of the default run on 2 cores. ``warm_start`` uses it only when the recipe — model,
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
import numpy as np

from sera_jax.agents.records import Turn
from sera_jax.agents.scripted import ScriptedGenerator
from sera_jax.rl.datums import Datum, merge_turns

CALL_PREFIXES = ("rubric:", "score:")
SHIPPED_DIR = Path(__file__).resolve().parent / "assets" / "tiny_warmstart"
# Bumped whenever the oracle or the choice of demonstrations changes what a recipe builds (2: agents failed only by a
# sabotaged descendant are demos too; 3: the choice to delegate depends on the depth only through the launch context
# a parent gives children at the depth limit; 4: the first cell prints the craftable ingredients the choice rests on).
DEMO_VERSION = 4


def recipe(cfg: Any) -> dict[str, Any]:
    """Returns what determines a warm start: the architecture, the tokenizer file's sha256, the prompt style and
    env caps the demos are played under, every ``warmstart`` field (seeds included) and the version
    of the oracle's demonstrations."""
    from sera_jax.checkpoint import sha256_file
    from sera_jax.tiny_tokenizer import SHIPPED

    tok = cfg.model.tokenizer
    tok_sha = sha256_file(str(SHIPPED)) if tok == "builtin:textcraft" else tok
    ws = {k: v for k, v in dataclasses.asdict(cfg.warmstart).items() if k not in ("enabled", "out_dir")}
    if not ws["exhaust_share"]:  # named only when on, so recipes from before the setting stay valid
        del ws["exhaust_share"]
    e, r = cfg.env, cfg.rollout
    return json.loads(json.dumps({
        "model": dataclasses.asdict(cfg.model_config()), "tokenizer": tok_sha,
        "env": {"name": e.name, "task_set": e.task_set, "difficulties": list(e.difficulties), "max_steps": e.max_steps,
                "max_depth": e.max_depth, "prompt_style": e.prompt_style,
                # Named only when on, so recipes (and shipped warm starts) from before the setting stay valid.
                **({"token_history": True} if e.token_history else {})},
        "rollout": {"max_completion_tokens": r.max_completion_tokens, "max_prompt_tokens": r.max_prompt_tokens,
                    "context_tokens": r.context_tokens},
        "method": cfg.method.name, "buckets": list(cfg.batch.buckets), "warmstart": ws,
        "demo_version": DEMO_VERSION}))


RECORD_NAME = "warmstart_recipe.json"  # in a warm-start run directory: the recipe it holds and its origin


def shipped_matches(cfg: Any, directory: Path = SHIPPED_DIR) -> bool:
    """Returns whether the shipped warm start was built from ``cfg``'s recipe."""
    record = directory / "warmstart.json"
    return record.is_file() and json.loads(record.read_text()).get("recipe") == recipe(cfg)


def ship(cfg: Any, run_dir: str | Path, directory: Path = SHIPPED_DIR) -> Path:
    """Writes the warm start in ``run_dir`` as the shipped asset (HF-format weights + ``warmstart.json``)."""
    from sera_jax.checkpoint import Checkpointer
    from sera_jax.model import save_pretrained

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


def _import_shipped(cfg: Any, ck: Any, tok_path: str, directory: Path = SHIPPED_DIR) -> None:
    from sera_jax.model import load_pretrained
    from sera_jax.rl.optim import OptimConfig, make_optimizer
    from sera_jax.train import make_meta
    from sera_jax.trainer import init_train_state

    model_cfg, params = load_pretrained(directory)
    record = json.loads((directory / "warmstart.json").read_text())
    meta = make_meta(cfg.to_dict(), model_cfg, tokenizer_path=tok_path)
    meta["warmstart"] = {**record.get("stats", {}), "source": f"shipped ({directory})"}
    ck.save(0, init_train_state(params, make_optimizer(OptimConfig())), meta, force=True)
    ck.wait()


class RecordingGenerator(ScriptedGenerator):
    """A ScriptedGenerator that keeps (TurnInfo, prompt ids, completion ids) of every call."""

    def __init__(self, tokenizer: Any, script: Any):
        super().__init__(tokenizer, script)
        self.records: list[tuple[Any, list[int], list[int]]] = []

    async def generate(self, prompt_ids, params, key=None):
        from sera_jax.agents.harness import CURRENT_TURN

        result = await super().generate(prompt_ids, params, key)
        self.records.append((CURRENT_TURN.get(), list(prompt_ids), list(result.token_ids)))
        return result


def _turn(index: int, prompt: list[int], completion: list[int]) -> Turn:
    return Turn(index=index, prompt_ids=prompt, completion_ids=completion, logprobs=[0.0] * len(completion),
                policy_version=0, completion_id=None)


def demo_datums(records: Sequence[tuple[Any, list[int], list[int]]], trees: Sequence[Any],
                sabotaged: set[tuple[str, str]]) -> tuple[list[Datum], dict[str, int]]:
    """Returns (SFT datums, counts): prefix-merged turns of every agent that played the gold plan — it succeeded, or
    it failed only because a sabotaged descendant did (its own replies are the same either way; dropping them would
    teach that delegating is rare) — and was not sabotaged itself, plus every rubric and score call; each datum
    trains its completion tokens with scalar 1."""
    from sera_jax.agents.records import TreeIndex

    gold = {}
    for t in trees:
        parent, failed_by_sabotage = TreeIndex.build(t).parent, set()
        for node_id in t.nodes:
            cur = node_id if (t.id, node_id) in sabotaged else None
            while cur is not None:  # a sabotaged node and its ancestors
                failed_by_sabotage.add(cur)
                cur = parent[cur]
        for n in t.nodes.values():
            ok = n.env_labels.get("success", 0.0) == 1.0 or n.id in failed_by_sabotage
            gold[(t.id, n.id)] = ok and not n.rollout_error_zero_reward
    by_agent: dict[tuple[str, str], list[Turn]] = {}
    calls: list[tuple[str, Turn]] = []
    for info, prompt, completion in records:
        if info is None:
            continue
        if info.node_id.startswith(CALL_PREFIXES):
            calls.append((info.node_id.split(":", 1)[0], _turn(0, prompt, completion)))
        else:
            turns = by_agent.setdefault((info.tree_id, info.node_id), [])
            turns.append(_turn(len(turns), prompt, completion))
    datums: list[Datum] = []
    counts = {"agents": len(by_agent), "agents_kept": 0, "rubric_calls": 0, "score_calls": 0}

    def add(seqs, objective: str, tree_id: str, node_id: str) -> None:
        for tokens, mask, logprobs, versions in seqs:
            datums.append(Datum(tokens=tuple(tokens), mask=tuple(mask), logprobs=tuple(logprobs),
                                versions=tuple(versions), scalar=1.0, objective=objective, traj_depth=0,
                                traj_start=0, tree_id=tree_id, node_id=node_id))

    for (tree_id, node_id), turns in by_agent.items():
        if gold.get((tree_id, node_id)) and (tree_id, node_id) not in sabotaged:
            counts["agents_kept"] += 1
            add(merge_turns(turns), "execution", tree_id, node_id)
    for kind, turn in calls:
        counts[f"{kind}_calls"] += 1
        add(merge_turns([turn]), "rubric_generation" if kind == "rubric" else "scoring", "", kind)
    return datums, counts


def first_turn_prompt(cfg: Any, tokenizer: Any, goal: str) -> list[int]:
    """Returns the prompt ids of a TextCraft agent's first turn for ``goal`` (no context), as the runtime sends it."""
    from sera_jax.agents.codeact import task_string
    from sera_jax.agents.codeact_prompt import system_prompt, task_message
    from sera_jax.agents.truncation import build_prompt

    style = cfg.env.prompt_style
    messages = [{"role": "system", "content": system_prompt(style)},
                {"role": "user", "content": task_message(task_string(goal, cfg.env.max_steps), style)}]
    return list(build_prompt(tokenizer, messages, cfg.rollout.max_prompt_tokens).ids)


def goal_copy_datums(cfg: Any, tokenizer: Any, tasks: Sequence[Any], oracle: Any, n: int,
                     seed: int) -> list[Datum]:
    """Returns ``n`` first-turn datums (the agent's opening prompt, exactly as ``CodeActEpisode.start`` builds it
    and ``build_prompt`` encodes it, and the oracle's first reply): the goal-copying turn, the one a small model
    finds hardest, for roots (the task's goal) and sub-agents (a craftable ingredient of a task's target in an
    amount of 1-6), over the given tasks' items."""
    from envs_py.textcraft.tasks import goal_text
    from sera_jax.agents.codeact import CONTEXT_SEP

    rng = random.Random(seed)
    out: list[Datum] = []
    while len(out) < n:
        task = tasks[rng.randrange(len(tasks))]
        targets = dict(task.payload.get("target_items") or {})
        goal, depth = task.goal, 0
        item = next(iter(targets), None)
        r = oracle.book.recipe(item) if item else None
        sub = [k for k in r.ingredients if oracle.book.can_craft(k)] if r is not None else []
        if sub and rng.random() < 0.5:
            targets = {rng.choice(sub): rng.randint(1, 6)}
            goal, depth = goal_text(targets), 1
            context = oracle.child_context(depth)
            if context:  # as the world writes a launch's context into the child's goal
                goal += CONTEXT_SEP + context
        prompt = first_turn_prompt(cfg, tokenizer, goal)
        reply_ids = list(tokenizer.encode(oracle.plan(targets, depth, ("copy", str(len(out))))[0]))
        completion = reply_ids[:next((i + 1 for i in range(len(reply_ids))
                                      if "</python>" in tokenizer.decode(reply_ids[:i + 1])), len(reply_ids))]
        (tokens, mask, logprobs, versions), = merge_turns([_turn(0, list(prompt), completion)])
        out.append(Datum(tokens=tuple(tokens), mask=tuple(mask), logprobs=tuple(logprobs), versions=tuple(versions),
                         scalar=1.0, objective="execution", traj_depth=depth, traj_start=0, node_id="copy"))
    return out


async def collect_demos(cfg: Any, tokenizer: Any, tasks: Sequence[Any]) -> tuple[list[Datum], dict[str, Any]]:
    """Runs the oracle on ``tasks`` through the runtime (execution-stage SERA launcher); returns (datums, stats)."""
    from envs_py.textcraft import recipe_book
    from sera_jax.agents.launchers import make_launcher_factory
    from sera_jax.agents.runtime import run_trees, start_pool
    from sera_jax.oracle import TextCraftOracle
    from sera_jax.run import runtime_settings

    ws = cfg.warmstart
    world = tasks[0].payload.get("world") or {}
    book = recipe_book(int(world.get("seed", 42)), int(world.get("items_per_domain_tier", 25)))
    oracle = TextCraftOracle(book, tokenizer, max_depth=cfg.env.max_depth, delegate_prob=ws.delegate_prob,
                             fail_prob=ws.fail_prob, exhaust_share=ws.exhaust_share, seed=ws.seed)
    gen = RecordingGenerator(tokenizer, oracle)
    settings = dataclasses.replace(runtime_settings(cfg), deterministic=False)
    method = cfg.method_config()
    # The first ``fork_demo_tasks`` tasks are played as in the rubric-generation stage (fork groups of
    # ``method.branching_factor`` branches, then the post-hoc rubric, whose prompt shows the parent's whole reply,
    # and the branch scores); the others as in the execution stage (a rubric before, a score after every child).
    split = min(ws.fork_demo_tasks, len(tasks))
    plays = [(stage, part) for stage, part in (("rubric_generation", list(tasks[:split])),
                                               ("execution", list(tasks[split:]))) if part]
    trees = []
    pool = await start_pool(cfg.env.num_workers)
    try:
        for stage, part in plays:
            # Side calls cut to the engine's context as in training (run.py), so a long child's scoring prompt
            # is the one the policy will see.
            factory = make_launcher_factory(stage, method, "textcraft", max_context=settings.max_context)
            done = await run_trees(part, "textcraft", gen, tokenizer, settings, pool=pool, max_concurrent=16,
                                   launcher_factory=factory)
            trees += await factory.finalize(done)
    finally:
        await pool.close()
    datums, counts = demo_datums(gen.records, trees, oracle.sabotaged)
    sabotaged = len(oracle.sabotaged)
    if ws.copy_demos:
        datums += goal_copy_datums(cfg, tokenizer, tasks, oracle, ws.copy_demos, ws.seed)
    roots = [t.nodes[t.root_id] for t in trees]
    stats = {"demo_trees": len(trees), "fork_demo_trees": split, "fork_groups": sum(len(t.fork_groups) for t in trees),
             "oracle_root_success": float(np.mean([r.reward for r in roots])),
             "delegations": sum(bool(d.child_ids) for t in trees for d in t.delegations),
             "refused_launches": sum(not d.child_ids for t in trees for d in t.delegations),
             "sabotaged_children": sabotaged,
             "goal_copy_datums": ws.copy_demos,
             "datums": len(datums), "trained_tokens": sum(d.num_trained for d in datums), **counts}
    return datums, stats


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
    from sera_jax.checkpoint import Checkpointer
    from sera_jax.config import check_mesh
    from sera_jax.model import init_params
    from sera_jax.parallel.mesh import make_mesh
    from sera_jax.rl.batch import pack_datums
    from sera_jax.rl.optim import OptimConfig, make_optimizer
    from sera_jax.run import load_env_tasks
    from sera_jax.tiny_tokenizer import resolve_tokenizer
    from sera_jax.train import make_meta
    from sera_jax.trainer import StepConfig, batch_axis_size, make_train_step, shard_train_state, stack_micro_batches

    ws = cfg.warmstart
    if cfg.env.name != "textcraft":
        raise ValueError(f"warmstart: the oracle warm start exists for TextCraft only (env.name is {cfg.env.name!r})")
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
        tokenizer, tok_path = resolve_tokenizer(cfg.model.tokenizer, cfg.model.hf_dir, out)
        if use_shipped and shipped_matches(cfg):
            _import_shipped(cfg, ck, tok_path)
            record.write_text(json.dumps({"recipe": recipe(cfg), "origin": "shipped"}) + "\n")
            log(f"warm start: the shipped one ({SHIPPED_DIR.name}, built by `sera-warmstart --ship` from this "
                f"config's recipe) copied to {out}")
            return out
        tasks, files = load_env_tasks(cfg)
        tasks = random.Random(ws.seed).sample(list(tasks), min(ws.demo_tasks, len(tasks)))
        datums, stats = asyncio.run(collect_demos(cfg, tokenizer, tasks))
        if not datums:
            raise RuntimeError("warm start: the oracle produced no demonstration (check env.task_set)")
        longest = max(len(d.tokens) for d in datums)
        datums = [d for d in datums if len(d.tokens) - 1 <= max(cfg.batch.buckets)]
        stats.update(collect_s=round(time.monotonic() - t0, 1), longest_datum=longest)
        log("warm start demos: " + json.dumps(stats))

        check_mesh(cfg, jax.device_count())
        mesh = make_mesh(cfg.mesh)
        model_cfg = cfg.model_config()
        params = init_params(jax.random.fold_in(jax.random.key(ws.init_seed), 0), model_cfg)
        tx = make_optimizer(OptimConfig(lr=ws.lr, warmup_steps=ws.warmup_steps, weight_decay=0.0))
        state = shard_train_state(params, tx, model_cfg, mesh)
        step_fn = make_train_step(model_cfg, tx, StepConfig(loss="pg"), mesh=mesh, state=state)
        ranks = batch_axis_size(mesh)
        history = []
        from tqdm import tqdm

        with open(out / "warmstart_metrics.jsonl", "w") as fh:
            for i, batch in enumerate(tqdm(_batches(datums, ws.token_budget, ws.steps, ws.seed), total=ws.steps,
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
