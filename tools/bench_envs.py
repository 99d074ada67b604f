"""Both environments' benchmarks in one run: TextCraft-Synth (tools, sandboxed cells, fork) and TextWorld-Sync
(actions, fork). Targets from the issues: ≥ 20,000 tool calls or actions /s/core, ≥ 1,000 sandboxed cells/s,
fork ≤ 50 µs.

Usage: ``python tools/bench_envs.py [--quick]``. Prints one table and a final ``RESULT key=value ...`` line.
"""

from __future__ import annotations

import argparse
import os
import re
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import bench_textcraft
import bench_textworld


def _key(env: str, metric: str) -> str:
    return env + "_" + re.sub(r"[^a-z0-9]+", "_", metric.lower()).strip("_")


def _target(row: dict) -> tuple[str, float] | None:
    """Returns (direction, value) of a row's target: the two scripts write ">= 20000" / "<= 50" strings or bare
    numbers (with the direction implied by the unit); None for informational rows."""
    t = row.get("target")
    if t is None or t == "-":
        return None
    if isinstance(t, str):
        m = re.match(r"\s*(>=|<=)\s*([0-9.]+)", t)
        if not m:
            return None
        return m.group(1), float(m.group(2))
    return ("<=" if row["unit"] in ("us", "µs", "ms", "s") else ">="), float(t)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--quick", action="store_true", help="fewer iterations (seconds, for CI)")
    args = parser.parse_args()
    rows = [("textcraft", r) for r in bench_textcraft.run(args.quick)]
    rows += [("textworld", r) for r in bench_textworld.run(args.quick)]
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


if __name__ == "__main__":
    main()
