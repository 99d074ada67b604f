"""What an agent's sandbox costs the machine: a fresh interpreter per sandbox against a fork of the zygote.

Usage: ``python tools/bench_sandbox.py [--n 40]``

Starts ``n`` sandboxes each way (``Sandbox(zygote=False)``: its own ``python -I -S`` that pre-imports and locks
down; ``Sandbox()``: a fork of ``sandbox.Zygote`` that locks down), runs one small cell in each, and reads each
sandbox process's own CPU time from ``/proc`` before killing it. Prints, side by side, the CPU seconds and the wall
time per sandbox (the zygote's one-off start is reported apart), then the round trips of a started sandbox: an
empty cell, and one tool call from inside a cell (the RPC a cell makes for every tool). On a 2-core machine every CPU second a sandbox
takes is taken from the rollout's device computation, which runs on the same cores (issue #34). Ends with
``RESULT key=value ...``. Linux only.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import time

from envs_py.sandbox import Sandbox, Zygote

TICK = os.sysconf("SC_CLK_TCK")
CELL = "import random, collections\nx = collections.Counter(random.choice('ab') for _ in range(100))\nprint(x['a'] > 0)"


def cpu_seconds(pid: int) -> float:
    """Returns the CPU seconds process ``pid`` has used so far (its main thread's run time in ns from
    ``/proc/PID/schedstat``, where the kernel keeps it; else user + system clock ticks, 10 ms steps)."""
    try:
        return int(open(f"/proc/{pid}/schedstat").read().split()[0]) / 1e9
    except (OSError, ValueError, IndexError):
        fields = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / TICK


async def measure(n: int, zygote: bool) -> tuple[float, float]:
    """Returns (CPU seconds, wall seconds) per sandbox started, used for one cell and killed."""
    cpu = 0.0
    t0 = time.perf_counter()
    for _ in range(n):
        sb = Sandbox([], [], zygote=zygote)
        r = await sb.run_cell(CELL, lambda *a: None)
        if r.output != "True\n":
            raise RuntimeError(f"the sandbox's cell failed: {r}")
        # the sandbox proper and, where it runs in namespaces, its keeper (the process the host or zygote started)
        # (getattr: this script also measures the single-process sandbox from before issue #49, for comparison)
        cpu += sum(cpu_seconds(pid) for pid in {sb.pid, getattr(sb.proc, "outer", sb.proc).pid})
        await sb.close()
    return cpu / n, (time.perf_counter() - t0) / n


def matmul_rate() -> float:
    """Returns this machine's fp32 matmul FLOP/s now (numpy, [512, 512] x [512, 512]): printed beside the timings,
    since the machine is shared and its speed varies from run to run."""
    import numpy as np

    a = np.ones((512, 512), np.float32)
    a @ a
    t0 = time.perf_counter()
    for _ in range(50):
        a @ a
    return 50 * 2 * 512 ** 3 / (time.perf_counter() - t0)


async def round_trips(cells: int, calls: int) -> tuple[float, float]:
    """Returns (seconds per trivial cell, seconds per tool call) in one started sandbox (a fork of the zygote)."""
    sb = Sandbox(["ping"], [], zygote=Zygote.available())
    await sb.start()
    await sb.run_cell("0", lambda *a: None)
    t0 = time.perf_counter()
    for _ in range(cells):
        await sb.run_cell("0", lambda *a: None)
    per_cell = (time.perf_counter() - t0) / cells
    t0 = time.perf_counter()
    r = await sb.run_cell(f"for _ in range({calls}):\n    ping(1)\nprint('ok')", lambda *a: a[1][0])
    per_call = (time.perf_counter() - t0) / calls
    await sb.close()
    if r.output != "ok\n":
        raise RuntimeError(f"the round-trip cell failed: {r}")
    return per_cell, per_call


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=40, help="sandboxes started each way (default 40)")
    args = ap.parse_args()
    if not Zygote.available():
        sys.exit("the zygote needs Linux pidfds (os.pidfd_open) and SERA_SANDBOX_ZYGOTE unset")
    own_cpu, own_wall = asyncio.run(measure(args.n, zygote=False))
    t0 = time.perf_counter()
    zygote = Zygote.shared()
    asyncio.run(measure(1, zygote=True))  # the zygote's interpreter start and pre-imports, once
    zygote_cpu, zygote_wall = cpu_seconds(zygote.proc.pid), time.perf_counter() - t0
    fork_cpu, fork_wall = asyncio.run(measure(args.n, zygote=True))
    cell_rt, call_rt = asyncio.run(round_trips(max(5, args.n * 5), max(20, args.n * 25)))
    rate = matmul_rate()
    print(f"{args.n} sandboxes each way, one cell each, on {os.cpu_count()} cores "
          f"(fp32 matmul rate now: {rate / 1e9:.0f} GFLOP/s):")
    print(f"  {'':28s}{'CPU per sandbox':>18s}{'wall per sandbox':>18s}")
    print(f"  {'own interpreter':28s}{own_cpu * 1e3:>15.1f} ms{own_wall * 1e3:>15.1f} ms")
    print(f"  {'fork of the zygote':28s}{fork_cpu * 1e3:>15.1f} ms{fork_wall * 1e3:>15.1f} ms")
    print(f"  (the zygote itself, once per host process: {zygote_cpu * 1e3:.0f} ms of CPU, "
          f"{zygote_wall * 1e3:.0f} ms)")
    print(f"  round trips in a started sandbox: an empty cell {cell_rt * 1e3:.2f} ms, one tool call from a cell "
          f"{call_rt * 1e6:.0f} us")
    print(f"RESULT n={args.n} own_cpu_ms={own_cpu * 1e3:.1f} fork_cpu_ms={fork_cpu * 1e3:.1f} "
          f"own_wall_ms={own_wall * 1e3:.1f} fork_wall_ms={fork_wall * 1e3:.1f} zygote_cpu_ms={zygote_cpu * 1e3:.0f} "
          f"cell_rt_ms={cell_rt * 1e3:.2f} call_rt_us={call_rt * 1e6:.0f} matmul_gflops={rate / 1e9:.0f}")


if __name__ == "__main__":
    main()
