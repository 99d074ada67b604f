"""Benchmark of the TextWorld-Sync world: actions per second per core and fork time.

Usage: python tools/bench_textworld.py [--quick]
Prints a table (metric, ours, target, unit) and a final line `RESULT key=value ...`.
"""

from __future__ import annotations

import argparse
import asyncio
import random
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from envs_py.textworld_sync import Coordinator, load_tasks, make_world

TARGET_ACTIONS_PER_S = 20_000
TARGET_FORK_US = 50.0
JUNK = ("take the moon", "Dice salt", "go to kitchen", "eat dish_9")


def _actions_per_second(tasks, total: int, seed: int = 0) -> float:
    """Random play (90% valid, 10% rejected actions) on fresh worlds; one core, every step fully observed."""
    rng = random.Random(seed)
    done = 0
    start = time.perf_counter()
    while done < total:
        for task in tasks:
            world = make_world(task)
            acts = world.valid_actions("root")
            for _ in range(min(task.max_steps, total - done)):
                action = rng.choice(acts) if rng.random() < 0.9 else rng.choice(JUNK)
                acts = world.step("root", action).infos["validActions"]
                done += 1
            if done >= total:
                break
    return done / (time.perf_counter() - start)


def _async_actions_per_second(task, total: int, n_agents: int = 4, seed: int = 0) -> float:
    """Concurrent asyncio agents stepping through one Coordinator (lock + atomic commit per action)."""
    coord = Coordinator(task)
    views = [coord.fork_shared(f"root/subagent-0-{k}") for k in range(n_agents)]
    per_agent = total // n_agents

    async def run(view, k):
        rng = random.Random(seed + k)
        _obs, infos = await view.observe_async()
        for _ in range(per_agent):
            action = rng.choice(infos["validActions"]) if rng.random() < 0.9 else rng.choice(JUNK)
            infos = (await view.step(action)).infos

    async def main():
        await asyncio.gather(*(run(v, k) for k, v in enumerate(views)))

    start = time.perf_counter()
    asyncio.run(main())
    return per_agent * n_agents / (time.perf_counter() - start)


def _time_us(fn, repeat: int) -> float:
    best = float("inf")
    for _ in range(5):
        start = time.perf_counter()
        for _ in range(repeat):
            fn()
        best = min(best, (time.perf_counter() - start) / repeat)
    return best * 1e6


def run(quick: bool = False) -> list[dict]:
    """Runs the benchmark; returns rows {metric, ours, target, unit} (target None = informational)."""
    tasks = load_tasks("sample")
    easy = tasks[0]
    hard = next(t for t in tasks if t.difficulty == "extreme")
    n = 20_000 if quick else 200_000
    rows = [
        {"metric": "textworld actions/s/core (World.step, observed)", "ours": round(_actions_per_second(tasks, n)),
         "target": TARGET_ACTIONS_PER_S, "unit": "actions/s"},
        {"metric": "textworld actions/s/core (Coordinator, 4 asyncio agents)",
         "ours": round(_async_actions_per_second(hard, n // 2)), "target": None, "unit": "actions/s"},
    ]
    world = make_world(easy)
    for action in ("take white onion", "dice white onion"):
        world.step("root", action)
    reps = 2_000 if quick else 20_000
    rows.append({"metric": "textworld fork, easy task", "ours": round(_time_us(world.fork, reps), 2),
                 "target": TARGET_FORK_US, "unit": "us"})
    big = make_world(hard)
    rows.append({"metric": "textworld fork, extreme task", "ours": round(_time_us(big.fork, reps), 2),
                 "target": None, "unit": "us"})
    branch = world.fork()
    rows.append({"metric": "textworld commit, easy task", "ours": round(_time_us(lambda: world.commit(branch), reps), 2),
                 "target": None, "unit": "us"})
    rows.append({"metric": "textworld digest, easy task", "ours": round(_time_us(world.digest, reps), 2),
                 "target": None, "unit": "us"})
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--quick", action="store_true", help="fewer repetitions")
    args = parser.parse_args()
    rows = run(quick=args.quick)
    width = max(len(r["metric"]) for r in rows)
    print(f"{'metric':<{width}}  {'ours':>12}  {'target':>10}  unit")
    for r in rows:
        target = "-" if r["target"] is None else (f">= {r['target']}" if r["unit"] == "actions/s" else f"<= {r['target']}")
        print(f"{r['metric']:<{width}}  {r['ours']:>12}  {target:>10}  {r['unit']}")
    ok_actions = rows[0]["ours"] >= TARGET_ACTIONS_PER_S
    ok_fork = rows[2]["ours"] <= TARGET_FORK_US
    print(f"RESULT tw_actions_per_s={rows[0]['ours']} tw_async_actions_per_s={rows[1]['ours']} "
          f"tw_fork_easy_us={rows[2]['ours']} tw_fork_extreme_us={rows[3]['ours']} tw_commit_us={rows[4]['ours']} "
          f"tw_digest_us={rows[5]['ours']} tw_actions_target_met={ok_actions} tw_fork_target_met={ok_fork}")


if __name__ == "__main__":
    main()
