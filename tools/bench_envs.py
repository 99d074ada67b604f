"""Benchmarks of the environments: TextCraft-Synth (world tool calls, sandboxed cells, world forks) and
TextWorld-Sync (actions per second per core, fork time). Targets: ≥ 20,000 tool calls or actions /s/core, ≥ 1,000
sandboxed cells/s, fork ≤ 50 µs.

Usage: ``python tools/bench_envs.py [--env textcraft|textworld|both] [--quick]``. One environment prints its own
table and its ``RESULT key=value ...`` line (TextCraft's keys ``tool_calls_per_s``..., TextWorld's ``tw_...``);
``both`` (the default) prints one table of both and a final ``RESULT`` line with ``all_targets_met``.
``textcraft_rows(quick)`` and ``textworld_rows(quick)`` return the rows as dicts with ``metric``, ``ours``,
``target`` and ``unit``.
"""

from __future__ import annotations

import argparse
import asyncio
import random
import re
import time

from envs_py.sandbox import Limits
from envs_py.textcraft import TextCraftSession, TextCraftWorld, load_tasks, official_recipes
from envs_py.textworld_sync import Coordinator, make_world
from envs_py.textworld_sync import load_tasks as load_textworld_tasks

# TextCraft-Synth


def _rich_world() -> TextCraftWorld:
    # The largest official inventory (an extreme task), plus plenty of raw_o5 so crafts keep succeeding.
    task = max(load_tasks("val"), key=lambda t: len(t.payload["initial_inventory"]))
    w = TextCraftWorld.from_task(task)
    w.inventory["raw_o5"] = 10**15
    for i in range(3):
        w.add_agent(f"sub{i}", {"o3_i1": 4}, "root")
    return w


def bench_tool_calls(quick: bool) -> float:
    """Returns validated world tool calls per second on one core (craft / get_info / view_inventory mix)."""
    w = _rich_world()
    call = w.call_tool
    mix = [("craft", ({"raw_o5": 2}, ("o3_i1", 4)), {}), ("get_info", (["o3_i1", "raw_o5"],), {}),
           ("view_inventory", (), {}), ("craft", ({"raw_o5": 3}, ("o3_i1", 4)), {})]  # the last one is an error
    n = 20_000 if quick else 200_000
    t0 = time.perf_counter()
    for i in range(n):
        name, args, kwargs = mix[i & 3]
        call("root", name, args, kwargs)
    return n / (time.perf_counter() - t0)


def bench_fork(quick: bool) -> tuple[float, float]:
    """Returns (fork µs, commit µs) of a world with the largest official inventory and four agents."""
    w = _rich_world()
    n = 20_000 if quick else 200_000
    t0 = time.perf_counter()
    for _ in range(n):
        b = w.fork()
    fork_us = (time.perf_counter() - t0) / n * 1e6
    t0 = time.perf_counter()
    for _ in range(n // 10):
        w.commit(b)
    return fork_us, (time.perf_counter() - t0) / (n // 10) * 1e6


async def _cells(quick: bool) -> tuple[float, float]:
    task = load_tasks("val")[0]
    s = TextCraftSession.from_task(task, limits=Limits())
    s.world.inventory["raw_o5"] = 10**15
    t0 = time.perf_counter()
    r = await s.run_cell("root", "x = 0")  # starts the agent's sandbox process
    start_ms = (time.perf_counter() - t0) * 1e3
    assert r["ok"], r
    n = 300 if quick else 3000
    code = "r = craft({'raw_o5': 2}, ('o3_i1', 4))"
    t0 = time.perf_counter()
    for _ in range(n):
        r = await s.run_cell("root", code)
    rate = n / (time.perf_counter() - t0)
    assert r["ok"] and s.world.inventory["o3_i1"] == 4 * n
    await s.close()
    return rate, start_ms


def textcraft_rows(quick: bool = False) -> list[dict]:
    """Returns TextCraft-Synth's rows: metric, ours, target, unit."""
    calls = bench_tool_calls(quick)
    fork_us, commit_us = bench_fork(quick)
    cells, start_ms = asyncio.run(_cells(quick))
    assert official_recipes() is not None
    return [
        {"metric": "world tool calls / s / core", "ours": round(calls), "target": ">= 20000", "unit": "calls/s"},
        {"metric": "sandboxed cells / s (1 tool RPC each)", "ours": round(cells), "target": ">= 1000",
         "unit": "cells/s"},
        {"metric": "world fork", "ours": round(fork_us, 2), "target": "<= 50", "unit": "us"},
        {"metric": "world commit", "ours": round(commit_us, 2), "target": "-", "unit": "us"},
        {"metric": "sandbox process start (locked down)", "ours": round(start_ms, 1), "target": "-", "unit": "ms"},
    ]


def print_textcraft(rows: list[dict]) -> None:
    """Prints TextCraft-Synth's table and its ``RESULT`` line."""
    print(f"{'metric':42s} {'ours':>12s} {'target':>10s}  unit")
    for r in rows:
        print(f"{r['metric']:42s} {r['ours']:>12} {r['target']:>10s}  {r['unit']}")
    keys = ["tool_calls_per_s", "cells_per_s", "fork_us", "commit_us", "sandbox_start_ms"]
    print("RESULT " + " ".join(f"{k}={r['ours']}" for k, r in zip(keys, rows)))


# TextWorld-Sync

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


def textworld_rows(quick: bool = False) -> list[dict]:
    """Returns TextWorld-Sync's rows {metric, ours, target, unit} (target None = informational)."""
    tasks = load_textworld_tasks("sample")
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


def print_textworld(rows: list[dict]) -> None:
    """Prints TextWorld-Sync's table and its ``RESULT`` line."""
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


# Both environments


def _key(env: str, metric: str) -> str:
    return env + "_" + re.sub(r"[^a-z0-9]+", "_", metric.lower()).strip("_")


def _target(row: dict) -> tuple[str, float] | None:
    """Returns (direction, value) of a row's target: TextCraft's rows write ">= 20000" / "<= 50" strings,
    TextWorld's bare numbers (with the direction implied by the unit); None for informational rows."""
    t = row.get("target")
    if t is None or t == "-":
        return None
    if isinstance(t, str):
        m = re.match(r"\s*(>=|<=)\s*([0-9.]+)", t)
        if not m:
            return None
        return m.group(1), float(m.group(2))
    return ("<=" if row["unit"] in ("us", "µs", "ms", "s") else ">="), float(t)


def print_both(rows: list[tuple[str, dict]]) -> None:
    """Prints both environments' rows in one table and one ``RESULT`` line (with ``all_targets_met``)."""
    print(f"{'env':<10} {'metric':<48} {'ours':>14} {'target':>12}  unit")
    results, met = [], True
    for env, r in rows:
        target = _target(r)
        shown = "-" if target is None else f"{target[0]} {target[1]:g}"
        print(f"{env:<10} {r['metric']:<48} {r['ours']:>14} {shown:>12}  {r['unit']}")
        results.append(f"{_key(env, r['metric'])}={r['ours']}")
        if target is not None:
            met &= (r["ours"] <= target[1]) if target[0] == "<=" else (r["ours"] >= target[1])
    print("RESULT " + " ".join(results) + f" all_targets_met={met}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--env", choices=("textcraft", "textworld", "both"), default="both",
                        help="which environment's benchmark (default: both, in one table)")
    parser.add_argument("--quick", action="store_true", help="fewer iterations (seconds, for CI)")
    args = parser.parse_args()
    if args.env == "textcraft":
        print_textcraft(textcraft_rows(args.quick))
    elif args.env == "textworld":
        print_textworld(textworld_rows(args.quick))
    else:
        print_both([("textcraft", r) for r in textcraft_rows(args.quick)]
                   + [("textworld", r) for r in textworld_rows(args.quick)])


if __name__ == "__main__":
    main()
