"""Benchmark of the TextCraft-Synth environment: world tool calls, sandboxed cells, world forks.

Usage: ``python tools/bench_textcraft.py [--quick]``. Prints a table and a final ``RESULT key=value ...`` line.
``run(quick)`` returns the rows as dicts with ``metric``, ``ours``, ``target`` and ``unit``.
"""

from __future__ import annotations

import asyncio
import os
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from envs_py.sandbox import Limits
from envs_py.textcraft import TextCraftSession, TextCraftWorld, load_tasks, official_recipes


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


def run(quick: bool = False) -> list[dict]:
    """Returns the benchmark rows: metric, ours, target, unit."""
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


def main() -> None:
    quick = "--quick" in sys.argv
    rows = run(quick)
    print(f"{'metric':42s} {'ours':>12s} {'target':>10s}  unit")
    for r in rows:
        print(f"{r['metric']:42s} {r['ours']:>12} {r['target']:>10s}  {r['unit']}")
    keys = ["tool_calls_per_s", "cells_per_s", "fork_us", "commit_us", "sandbox_start_ms"]
    print("RESULT " + " ".join(f"{k}={r['ours']}" for k, r in zip(keys, rows)))


if __name__ == "__main__":
    main()
