"""The rubric probe: how well the policy evaluates, measured on one fixed set of counterfactual fork groups.

Training's own ranking numbers (``rubric_ranking_accuracy`` at rubric-generation steps) come from whichever fork
groups a step happened to rank — one or two per step in the tiny settings — written by a policy that changes
every step, so they swing between 0 and 1. The probe holds the groups fixed and asks only the rubric writer to
change:

1. ``collect_probe_set``: the policy plays held-out tasks (``eval.task_set``) under the rubric-generation stage's
   launcher (the method's branching factor and environment budget; ``rollout.rubric_stage_temperature``) until
   ``eval.rubric_probe_groups`` *mixed* fork groups (complete, with at least one success and one failure by the
   environment's label) are found. Their trees (only the mixed groups kept) go to one JSONL file. TextCraft only:
   its labels are programmatic; TextWorld's need a judge, and the probe refuses it.
2. ``score_probe``: for each group, the policy under test writes a fresh rubric from the group's recorded inputs
   (the same prompt as the rubric-generation stage, at the method's rubric temperature) and scores every branch
   under it (temperature 0): ``rank_fork_groups`` on a copy of the record. ``eval.rubric_probe_samples`` rubrics
   per group, each from its own key, average out the rubric sampling.

Reported (``probe_metrics``), over all (group, sample) pairs: ``rubric_valid`` (the rubric parsed), ``ranked`` (it
parsed and at least 2 branches got a valid score, with both labels among them: the stage's "ranked" group), and
over the ranked pairs the stage's own numbers — ``ranking_accuracy`` (success × failure pairs whose success scores
strictly higher), ``ranking_auc`` (ties count 1/2) and ``hinge_reward`` (the rubric-generation reward, docs/design/algorithm.md §5.2).
``ranking_accuracy_all`` counts an unranked pair as 0: the share of all pairs a rubric ranked right.

The set is collected once (the starting policy, a fixed ``eval.rubric_probe_seed``) and shared: every method and
seed of an ablation scores the same groups, before and after training.
"""

from __future__ import annotations

import asyncio
import dataclasses
import os
import random
from pathlib import Path
from types import SimpleNamespace
from typing import Any, Sequence

import jax
import numpy as np

from sera_jax.agents.environments import environment
from sera_jax.agents.launchers.counterfactual import rank_fork_groups
from sera_jax.agents.launchers.factory import make_launcher_factory, rubric_stage_config
from sera_jax.agents.records import ForkGroup, Tree, dumps_tree, loads_tree, read_jsonl, write_jsonl
from sera_jax.agents.runtime import run_tree, start_pool
from sera_jax.assembly.settings import runtime_settings, stage_settings
from sera_jax.rl.rewards import hinge_rank_reward
from sera_jax.training.stats import pairwise_accuracy, ranking_auc

__all__ = ["mixed_group", "collect_probe_set", "load_probe_set", "score_probe", "probe_metrics", "PROBE_FILE"]

PROBE_FILE = "rubric_probe.json"  # the probe's numbers, next to an evaluation's report.json


def _played(g: ForkGroup) -> bool:
    # Every branch ran (complete but for a rubric: the probe writes its own).
    return len(g.branches) == g.num_branches and all(b.trajectory_id for b in g.branches)


def mixed_group(g: ForkGroup) -> bool:
    """True iff every branch of the group ran and their labels hold both a success and a failure."""
    labels = [b.success for b in g.branches if b.success is not None]
    return _played(g) and any(labels) and not all(labels)


async def collect_probe_set(cfg: Any, generator: Any, tokenizer: Any, path: str | Path, *, groups: int,
                            seed: int = 0, concurrency: int | None = None, max_tasks: int | None = None,
                            log: Any = print) -> list[Tree]:
    """Plays held-out tasks under the rubric-generation launcher until ``groups`` mixed fork groups are found;
    writes their trees (mixed groups only) to ``path`` and returns them. Raises ValueError when the task set runs
    out first (say how many were found) or for an environment without programmatic labels."""
    from sera_jax.evaluation.protocol import load_eval_tasks

    if not environment(cfg.env.name).programmatic:
        raise ValueError(f"the rubric probe needs programmatic branch labels (TextCraft), not {cfg.env.name!r}")
    if groups < 1:
        raise ValueError(f"eval.rubric_probe_groups must be ≥ 1 to collect a probe set, got {groups}")
    tasks = list(load_eval_tasks(cfg))
    random.Random(seed).shuffle(tasks)
    if max_tasks is not None:
        tasks = tasks[:max_tasks]
    settings = stage_settings(dataclasses.replace(runtime_settings(cfg), seed=seed), cfg, "rubric_generation", 0)
    factory = make_launcher_factory("rubric_generation", cfg.method_config(), cfg.env.name, settings=settings)
    wave = concurrency or cfg.eval.concurrency
    kept: list[Tree] = []
    found, played = 0, 0
    seen = {"fork_groups": 0, "complete": 0, "all_success": 0, "all_failure": 0}
    pool = await start_pool(cfg.env.num_workers)
    try:
        for i in range(0, len(tasks), wave):
            chunk = tasks[i:i + wave]

            async def one(task):
                tree = await run_tree(task, cfg.env.name, generator, tokenizer, settings, pool=pool,
                                      launcher=factory(task, 0), tree_id=f"probe:{task.task_id}")
                factory.launchers.pop((str(task.task_id), 0), None)  # no post-hoc rubric: score_probe writes them
                return tree

            for tree in await asyncio.gather(*(one(t) for t in chunk)):
                played += 1
                for g in tree.fork_groups:
                    labels = [bool(b.success) for b in g.branches]
                    seen["fork_groups"] += 1
                    seen["complete"] += _played(g)
                    seen["all_success"] += _played(g) and all(labels)
                    seen["all_failure"] += _played(g) and not any(labels)
                mixed = [g for g in tree.fork_groups if mixed_group(g)]
                if not mixed or found >= groups:
                    continue
                mixed = mixed[:groups - found]
                tree.fork_groups = mixed
                ids = {g.id for g in mixed}
                inputs = tree.misc.get("fork_group_inputs", {})
                tree.misc = {"fork_group_inputs": {k: v for k, v in inputs.items() if k in ids},
                             "probe": {"seed": seed, "task_id": str(tree.task_id)}}
                kept.append(tree)
                found += len(mixed)
            if found >= groups:
                break
    finally:
        await pool.close()
    if found < groups:
        raise ValueError(f"rubric probe: {played} held-out tasks gave {found} mixed fork groups, fewer than "
                         f"eval.rubric_probe_groups={groups} ({seen})")
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.unlink(missing_ok=True)
    write_jsonl(kept, tmp)
    os.replace(tmp, path)  # a half-written set is never taken for a finished one
    log(f"rubric probe: {found} mixed fork groups from {played} held-out tasks ({seen}) -> {path}")
    return kept


def load_probe_set(path: str | Path) -> list[Tree]:
    """Returns the trees of a probe set; raises ValueError when a tree holds a group that is not mixed."""
    trees = list(read_jsonl(path))
    for t in trees:
        bad = [g.id for g in t.fork_groups if not mixed_group(g)]
        if bad:
            raise ValueError(f"{path}: fork groups {bad} are not mixed (complete, with both labels)")
    if not trees:
        raise ValueError(f"{path}: no probe trees")
    return trees


async def score_probe(cfg: Any, trees: Sequence[Tree], generator: Any, tokenizer: Any, *, samples: int,
                      seed: int = 0, concurrency: int | None = None) -> dict[str, float]:
    """Has the policy behind ``generator`` rank every probe group ``samples`` times; returns ``probe_metrics``."""
    if samples < 1:
        raise ValueError(f"eval.rubric_probe_samples must be ≥ 1, got {samples}")
    settings = runtime_settings(cfg)
    rcfg = rubric_stage_config(cfg.method_config(), settings)
    gate = asyncio.Semaphore(concurrency or cfg.eval.concurrency)
    base = jax.random.key(seed)

    async def one(s: int, k: int, tree: Tree) -> list[ForkGroup]:
        copy = loads_tree(dumps_tree(tree))
        run = SimpleNamespace(tree=copy, generator=generator, tokenizer=tokenizer, settings=settings,
                       root_key=jax.random.fold_in(jax.random.fold_in(base, s), k))
        async with gate:
            await rank_fork_groups(copy, run, rcfg)
        return copy.fork_groups

    jobs = [one(s, k, t) for s in range(samples) for k, t in enumerate(trees)]
    ranked = [g for gs in await asyncio.gather(*jobs) for g in gs]
    return probe_metrics(ranked, margin=cfg.method_config().ranking_margin, samples=samples)


def probe_metrics(groups: Sequence[ForkGroup], *, margin: float = 0.2, samples: int = 1) -> dict[str, float]:
    """Returns the probe's numbers (module docstring) over ranked copies of the probe groups."""
    acc, auc, hinge = [], [], []
    valid = 0
    for g in groups:
        valid += g.rubric is not None
        pairs = [(b.score, bool(b.success)) for b in g.branches if b.score is not None and b.success is not None]
        if g.rubric is None or len(pairs) < 2:
            continue
        s, y = [p[0] for p in pairs], [p[1] for p in pairs]
        a = ranking_auc(s, y)
        if a is None:
            continue
        auc.append(a)
        acc.append(pairwise_accuracy(s, y))
        hinge.append(hinge_rank_reward(s, y, margin))
    n = len(groups)
    out = {"groups": float(n / samples), "samples": float(samples), "rubric_valid": valid / n if n else 0.0,
           "ranked": len(acc) / n if n else 0.0, "ranking_accuracy_all": float(np.sum(acc) / n) if n else 0.0}
    if acc:
        out.update(ranking_accuracy=float(np.mean(acc)), ranking_auc=float(np.mean(auc)),
                   hinge_reward=float(np.mean(hinge)))
    return out
