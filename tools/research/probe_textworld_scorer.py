"""Does a TextWorld policy's scorer (and its frozen judge) read the world, or the trajectory's look?

Re-scores recorded sub-agents: every scored child in the given ``trees.jsonl`` files (training or evaluation trees)
is scored again by the policy under test, through the execution stage's own call (``rubric_calls.score_node``: the
child's rubric from the record, its replies and finish message, the scoring caps of the config) and labelled by the
``policy_frozen`` judge's call. The final state shown is the child's last observation's dish lines (training
scored the world as it stood when the child returned: the same lines unless a sibling moved a dish in between).
The truth is that state: every dish of the child's goal eaten. Printed: one row per (finish message given or
not, own dish eaten or not, another dish eaten or not) with the scorer's and the judge's verdicts, and their
accuracy on each truth — the same children for every checkpoint, so two warm starts compare on identical inputs.
The children measured in docs/results/textworld.md (their sampled tokens stripped) are in ``docs/results/textworld/scorer_probe/``:
311 from three 20-turn training runs (``children.jsonl.gz``), 56 evaluation trees under 10 turns
(``tight_eval_children.jsonl.gz``, with ``--oracle-rubric``) and the shipped warm start's first training trees
(``train_v0_children_v4.jsonl.gz``); the ``*.json`` beside them are this tool's outputs.

Usage: python tools/research/probe_textworld_scorer.py TREES.jsonl[.gz] [...] [--checkpoint RUN_OR_DIR]
       [--config configs/tiny_textworld.yaml] [--limit N] [--json OUT] [--oracle-rubric]
(without ``--checkpoint``: the config's starting policy, e.g. the shipped warm start)
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import json
import re
from pathlib import Path
from types import SimpleNamespace

import jax

from sera_jax.agents.judge import make_judge
from sera_jax.agents.records import read_jsonl
from sera_jax.agents.rubric import parse_rubric
from sera_jax.agents.rubric_calls import RubricConfig, run_limits, score_node
from sera_jax.assembly.judge import judge_settings
from sera_jax.assembly.settings import runtime_settings
from sera_jax.config import load_config
from sera_jax.assembly.engines import engine_config
from sera_jax.evaluation.protocol import load_policy
from sera_jax.parallel.mesh import MeshConfig, make_mesh
from sera_jax.sampling import Engine
from sera_jax.warmstart.textworld_oracle import eaten_dishes, rubric_text

_LINE = re.compile(r"- (dish_\d+): (\d+)/(\d+) ingredients prepared, meal_prepared=(\w+), meal_eaten=(\w+)")


def state_of(observation: str) -> dict:
    """Returns the world-state dict (``{"dishes": ...}``) whose dish lines are ``observation``'s."""
    dishes = {}
    for dish, ready, total, prepared, eaten in _LINE.findall(observation or ""):
        dishes[dish] = {"ingredients": {f"i{k}": {"ready": k < int(ready)} for k in range(int(total))},
                        "meal_prepared": prepared == "True", "meal_eaten": eaten == "True"}
    return {"dishes": dishes}


def dishes_eaten(node) -> tuple[bool, bool]:
    """Returns (every dish the child's goal names -- ``Prepare and eat dish_1[, dish_2]: …`` -- is eaten, another
    dish (a sibling's) is eaten) in its last observation."""
    dishes = set(re.findall(r"dish_\d+", node.goal.split(":", 1)[0]))
    eaten = eaten_dishes(node.misc.get("final_observation", ""))
    return (bool(dishes) and all(eaten.get(d) for d in dishes),
            any(e for d, e in eaten.items() if d not in dishes))


def scored_children(paths, limit: int | None, oracle_rubric: bool = False):
    """Yields (tree, node, rubric) for every child with a recorded rubric and score, at most ``limit`` of them; with
    ``oracle_rubric``, also every child without one (an evaluation's trees: no rubric is written there), under the
    warm start's demonstrated rubric for its goal (``textworld_oracle.rubric_text``)."""
    seen = 0
    for path in paths:
        for tree in read_jsonl(path):
            for node in tree.nodes.values():
                if not node.depth:
                    continue
                rs = node.rubric_score
                if rs is not None and rs.rubric is not None and rs.score is not None:
                    rubric = rs.rubric
                elif oracle_rubric:
                    rubric, why = parse_rubric(rubric_text(node.goal))
                    if rubric is None:
                        raise ValueError(f"the oracle's rubric for {node.goal!r} does not parse: {why}")
                else:
                    continue
                yield tree, node, rubric
                seen += 1
                if limit is not None and seen >= limit:
                    return


async def probe(cfg, checkpoint: str | None, paths, limit: int | None = None, concurrency: int = 16,
                oracle_rubric: bool = False) -> dict:
    """Returns {"rows": {(finish, own, other): {"scorer": Counter, "judge": Counter}}, "accuracy": {...}}: ``own``
    whether the child's own dish is eaten (the truth), ``other`` whether another dish is (a scorer that reads "some
    meal eaten" is wrong exactly where the two differ)."""
    policy = load_policy(cfg, checkpoint=checkpoint)
    engine = Engine(policy.model_cfg, policy.params, engine_config(cfg, policy.model_cfg.dtype, evaluation=True,
                                                                        model_cfg=policy.model_cfg),
                    tokenizer=policy.tokenizer, mesh=make_mesh(MeshConfig(1, 1, 1), jax.local_devices()[:1]),
                    seed=cfg.train.seed)
    settings = runtime_settings(cfg)
    spec = RubricConfig.from_method(cfg.method_config(), **run_limits(settings)).scoring_spec()
    judge = make_judge(cfg.env.name, judge_settings(cfg), generator=engine, tokenizer=policy.tokenizer)
    gate = asyncio.Semaphore(concurrency)
    rows: dict = collections.defaultdict(lambda: {"scorer": collections.Counter(), "judge": collections.Counter()})

    async def one(k: int, tree, node, rubric) -> None:
        truth, other = dishes_eaten(node)
        key = ("finish" if node.finish_message else "no finish", "own dish eaten" if truth else "own dish not eaten",
               "another eaten" if other else "no other eaten")
        run = SimpleNamespace(tree=tree, generator=engine, tokenizer=policy.tokenizer, settings=settings,
                              root_key=jax.random.key(k))
        async with gate:
            _, score, _ = await score_node(run, rubric, node,
                                           state_of(node.misc.get("final_observation", "")), spec, f"score:{node.id}")
            label = await judge.label(node, tree.nodes[tree.root_id].goal)
        rows[key]["scorer"]["invalid" if score is None else str(score.success)] += 1
        rows[key]["judge"]["invalid" if label.success is None else str(bool(label.success))] += 1

    try:
        await asyncio.gather(*(one(k, *c) for k, c in enumerate(scored_children(paths, limit, oracle_rubric))))
    finally:
        engine.close()
    accuracy = {}
    for who in ("scorer", "judge"):
        for truth in (True, False):
            tag = "own dish eaten" if truth else "own dish not eaten"
            right = sum(r[who][str(truth)] for (_, own, _), r in rows.items() if own == tag)
            total = sum(sum(r[who].values()) for (_, own, _), r in rows.items() if own == tag)
            accuracy[f"{who} on {tag}"] = (right, total)
        mixed = [r for (_, own, other), r in rows.items() if own == "own dish not eaten" and other == "another eaten"]
        accuracy[f"{who} on own dish not eaten, another eaten"] = (sum(r[who]["False"] for r in mixed),
                                                                  sum(sum(r[who].values()) for r in mixed))
    return {"rows": {" / ".join(k): {w: dict(c) for w, c in r.items()} for k, r in sorted(rows.items())},
            "accuracy": {k: {"right": a, "of": b} for k, (a, b) in accuracy.items()}}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--checkpoint", default=None)
    ap.add_argument("trees", nargs="+")
    ap.add_argument("--config", default="configs/tiny_textworld.yaml")
    ap.add_argument("--limit", type=int, default=None)
    ap.add_argument("--json", default=None)
    ap.add_argument("--oracle-rubric", action="store_true",
                    help="also probe children with no recorded rubric (evaluation trees), under the oracle's rubric")
    args = ap.parse_args(argv)
    cfg = load_config([args.config])
    if cfg.env.name != "textworld_sync":
        ap.error(f"{args.config} is not a TextWorld config")
    out = asyncio.run(probe(cfg, args.checkpoint, args.trees, args.limit, oracle_rubric=args.oracle_rubric))
    print(f"{'children (finish / truth / siblings)':56s} {'scorer verdicts':30s} judge verdicts")
    for key, r in out["rows"].items():
        print(f"{key:56s} {json.dumps(r['scorer']):30s} {json.dumps(r['judge'])}")
    for k, v in out["accuracy"].items():
        print(f"{k:50s} {v['right']}/{v['of']}")
    if args.json:
        Path(args.json).write_text(json.dumps({"checkpoint": args.checkpoint, "trees": args.trees, **out}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
