"""Run one sera command as N processes on this machine, as N hosts would run it: a multi-host job simulated on CPU.

    python tools/local_hosts.py -n 2 --devices 2 -- sera-train model.init_from=RUN --out runs/two_hosts

Every process gets ``SERA_COORDINATOR=localhost:<free port>``, ``SERA_NUM_PROCESSES=N``, ``SERA_PROCESS_ID=i``,
``JAX_PLATFORMS=cpu`` and ``--devices`` fake CPU devices (gloo collectives between the processes). Output lines are
prefixed ``[p<i>]``. SIGINT / SIGTERM are passed on to every process (as a cluster's scheduler would). When a process
exits non-zero, the others get ``--grace`` seconds to end on their own (a multi-host job notices a lost process)
before they are killed. Exit status: the first non-zero status of a process, else 0.
"""

from __future__ import annotations

import argparse
import os
import signal
import socket
import subprocess
import sys
import threading
import time


def free_port() -> int:
    """Returns a TCP port free on localhost now."""
    with socket.socket() as s:
        s.bind(("localhost", 0))
        return s.getsockname()[1]


def host_env(num: int, pid: int, port: int, devices: int, base: dict | None = None) -> dict[str, str]:
    """Returns the environment of process ``pid`` of a ``num``-process job on this machine."""
    env = dict(os.environ if base is None else base)
    flags = " ".join(f for f in env.get("XLA_FLAGS", "").split() if "device_count" not in f)
    env.update(SERA_COORDINATOR=f"localhost:{port}", SERA_NUM_PROCESSES=str(num), SERA_PROCESS_ID=str(pid),
               JAX_PLATFORMS="cpu", XLA_FLAGS=f"{flags} --xla_force_host_platform_device_count={devices}".strip())
    return env


def _pump(proc: subprocess.Popen, tag: str) -> None:
    for line in proc.stdout:
        sys.stdout.write(f"[{tag}] {line}")
        sys.stdout.flush()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("-n", "--processes", type=int, default=2)
    p.add_argument("--devices", type=int, default=2, help="fake CPU devices per process")
    p.add_argument("--port", type=int, default=None, help="coordinator port (default: a free one)")
    p.add_argument("--grace", type=float, default=120.0, help="seconds the others get after one fails")
    p.add_argument("command", nargs=argparse.REMAINDER, help="-- then the command every process runs")
    args = p.parse_args(argv)
    cmd = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not cmd or args.processes < 1 or args.devices < 1:
        p.error("need -n ≥ 1, --devices ≥ 1 and a command after --")
    port = args.port or free_port()
    procs = [subprocess.Popen(cmd, env=host_env(args.processes, i, port, args.devices), stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True, bufsize=1)
             for i in range(args.processes)]
    pumps = [threading.Thread(target=_pump, args=(pr, f"p{i}"), daemon=True) for i, pr in enumerate(procs)]
    for t in pumps:
        t.start()

    def forward(signum, _frame):
        for pr in procs:
            if pr.poll() is None:
                pr.send_signal(signum)

    signal.signal(signal.SIGINT, forward)
    signal.signal(signal.SIGTERM, forward)
    first_fail: int | None = None
    deadline = None
    while any(pr.poll() is None for pr in procs):
        for pr in procs:
            rc = pr.poll()
            if rc not in (None, 0) and first_fail is None:
                first_fail = rc
                deadline = time.monotonic() + args.grace
        if deadline is not None and time.monotonic() > deadline:
            for i, pr in enumerate(procs):
                if pr.poll() is None:
                    print(f"[local_hosts] process {i} still running {args.grace:.0f} s after a failure: killed",
                          flush=True)
                    pr.kill()
        time.sleep(0.2)
    for t in pumps:
        t.join(timeout=5)
    codes = [pr.returncode for pr in procs]
    if first_fail is None:
        first_fail = next((c for c in codes if c), 0)
    print(f"[local_hosts] exit statuses {codes}", flush=True)
    return first_fail


if __name__ == "__main__":
    sys.exit(main())
