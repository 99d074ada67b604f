"""``sera-eval`` of one checkpoint two ways on the same tasks: in process, and through ``sera-serve`` with
``--endpoint``.

Usage: ``python tools/bench_served_eval.py [--tasks N] [--concurrency C] [--out DIR]``.

The shipped tiny TextCraft warm start (the tiny default's policy) is evaluated at temperature 0 (greedy; the tiny default's own is 0.7) on the first N
official Easy validation tasks of the tiny default config (``configs/tiny_cpu.yaml``), once in process and once
through a ``sera-serve`` of the same weights (imported as a run with ``sera-export --import``) on 127.0.0.1, each as
the ``sera-eval`` command a user runs, timed from the command to its exit (start-up, compilation and the pass; the
server's own start-up is not in the endpoint figure, as a user's server is up before the pass). Printed side by
side: wall seconds, success, completion tokens (the trees' own counts; the served pass also counts them from the
server's ``usage``), agent turns, then the outcomes task for task (agreement, and the first turn where the two
trees' completions differ), the turns whose prompt the server counted otherwise than the tree records, and the
machine's fp32 matmul rate on the model's largest projection. The server runs
on this machine's cores beside the client: what the endpoint figure measures includes HTTP and JSON on both sides.
Ends with a RESULT line.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from sera_jax.agents.records import read_jsonl
from sera_jax.config import load_config
from sera_jax.interop.export import import_pretrained
from sera_jax.profiling.machine import matmul_rate
from sera_jax.serving.process import serve_process
from sera_jax.warmstart.sft import SHIPPED_DIRS

ROOT = Path(__file__).resolve().parents[1]
SERVE_FLAGS = ("--max-batch", "16", "--max-context", "1024", "--max-tokens", "512")


def _eval(out: Path, *args: str) -> tuple[float, subprocess.CompletedProcess]:
    t0 = time.monotonic()
    r = subprocess.run([sys.executable, "-m", "sera_jax.cli.eval", *args, "--out", str(out)],
                       env={**os.environ, "JAX_PLATFORMS": "cpu"}, capture_output=True, text=True, cwd=ROOT)
    if r.returncode != 0:
        raise SystemExit(f"sera-eval {' '.join(args)} exited {r.returncode}:\n{r.stderr[-3000:]}")
    return time.monotonic() - t0, r


def _summary(out: Path) -> dict:
    rep = json.loads((out / "report.json").read_text())
    tasks = {t["task_id"]: t for t in rep["tasks"][0]}
    trees = {t.task_id: t for t in read_jsonl(out / "trees.jsonl")}
    return {"rate": rep["mean_std"]["overall"][0], "tasks": tasks, "trees": trees,
            "completion_tokens": sum(int(t["stats"].get("completion_tokens", 0)) for t in tasks.values()),
            "served_tokens": sum(int(t["stats"].get("served_completion_tokens", 0)) for t in tasks.values()),
            "turns": sum(int(t["stats"].get("turns", 0)) for t in tasks.values())}


def _first_difference(a, b) -> int | None:
    """Returns the index of the first root turn whose completion differs (None: the roots agree throughout)."""
    ta, tb = a.nodes["root"].turns, b.nodes["root"].turns
    for i, (x, y) in enumerate(zip(ta, tb)):
        if list(x.completion_ids) != list(y.completion_ids):
            return i
    return None if len(ta) == len(tb) else min(len(ta), len(tb))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--tasks", type=int, default=32)
    p.add_argument("--concurrency", type=int, default=16, help="eval.concurrency on both sides")
    p.add_argument("--out", default=None, help="keep the two passes here (default: a temporary directory)")
    a = p.parse_args()
    work = Path(a.out or tempfile.mkdtemp(prefix="bench-served-eval-"))
    work.mkdir(parents=True, exist_ok=True)
    # Both sides encode each prompt from the conversation's text, as a chat server must (the endpoint pass turns
    # the tiny default's env.token_history off; in process it is turned off here, so the protocols are one).
    common = ["--tasks", str(a.tasks), "--runs", "1", f"eval.concurrency={a.concurrency}", "env.token_history=false",
              "eval.temperature=0"]  # the tiny default evaluates at 0.7; greedy makes the two passes comparable

    rate = matmul_rate(load_config(ROOT / "configs" / "tiny_cpu.yaml").model_config())
    print(f"machine: fp32 matmul {rate / 1e9:.1f} GFLOP/s on the model's largest projection; "
          f"{os.cpu_count()} cores", flush=True)
    local_s, _ = _eval(work / "in_process", "--hf", str(SHIPPED_DIRS["textcraft"]), *common)
    run_dir = import_pretrained(SHIPPED_DIRS["textcraft"], work / "served_run")
    server = serve_process([str(run_dir)], *SERVE_FLAGS)
    try:
        served_s, _ = _eval(work / "endpoint", "--endpoint", server.url, "--model", run_dir.name, *common)
    finally:
        server.stop()
    mine, theirs = _summary(work / "in_process"), _summary(work / "endpoint")
    if mine["tasks"].keys() != theirs["tasks"].keys():
        raise SystemExit("the two passes evaluated different tasks")

    print(f"\n{a.tasks} tasks, concurrency {a.concurrency}, temperature 0")
    print(f"{'':28s}{'in process':>14s}{'sera-serve':>14s}")
    print(f"{'wall s (command to exit)':28s}{local_s:14.1f}{served_s:14.1f}")
    print(f"{'success %':28s}{mine['rate']:14.1f}{theirs['rate']:14.1f}")
    print(f"{'completion tokens (trees)':28s}{mine['completion_tokens']:14d}{theirs['completion_tokens']:14d}")
    print(f"{'completion tokens (usage)':28s}{'-':>14s}{theirs['served_tokens']:14d}")
    print(f"{'agent turns':28s}{mine['turns']:14d}{theirs['turns']:14d}")
    mismatch = sum(int(t["stats"].get("prompt_mismatch_turns", 0)) for t in theirs["tasks"].values())
    print(f"{'prompts the server counted':28s}{'':14s}{'otherwise: ' + str(mismatch):>14s}")
    agree, same_trees, firsts = 0, 0, []
    for tid, t in mine["tasks"].items():
        agree += t["success"] == theirs["tasks"][tid]["success"]
        d = _first_difference(mine["trees"][tid], theirs["trees"][tid])
        same_trees += d is None
        if d is not None:
            firsts.append(d)
    print(f"\noutcomes equal on {agree}/{a.tasks} tasks; root trajectories identical on {same_trees}/{a.tasks}"
          + (f"; where they differ, first at root turn {sorted(firsts)}" if firsts else ""))
    print(f"RESULT tasks={a.tasks} in_process_s={local_s:.1f} endpoint_s={served_s:.1f} "
          f"ratio={served_s / local_s:.2f} outcomes_equal={agree}/{a.tasks} identical_roots={same_trees}/{a.tasks} "
          f"prompt_mismatch_turns={mismatch} matmul_gflops={rate / 1e9:.1f} out={work}")


if __name__ == "__main__":
    main()
