"""Does to a real tiny ``sera-train`` what a cluster does to a run directory, one fault at a time, and prints what
happened: exit codes, the lines printed, the versions recorded, and the final parameters against an uninterrupted
run (docs/results/run_dir_faults.md).

    python tools/research/run_dir_faults.py --out /tmp/faults        # ~20-40 min on 2 CPU cores

The runs start from the shipped warm start with one task group per step and deterministic scheduling (the update
never overlaps rollouts), so a resumed run can be held to an uninterrupted one parameter for parameter. Every
subprocess shares one compilation cache (the first run compiles). The report is printed and written to
``OUT/report.md``; the run directories stay under ``OUT`` for inspection.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np

PY = sys.executable


def module(name: str) -> list[str]:
    return [PY, "-m", f"sera_jax.cli.{name}"]


class Proc:
    """A command in its own process group (as a terminal job), its output lines collected as they arrive."""

    def __init__(self, cmd: list[str], env: dict[str, str]):
        self.p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
                                  start_new_session=True)
        self.lines: list[str] = []
        self.err: list[str] = []
        self.t0 = time.monotonic()
        self._threads = [threading.Thread(target=self._pump, args=(s, e), daemon=True)
                         for s, e in ((self.p.stdout, False), (self.p.stderr, True))]
        for t in self._threads:
            t.start()

    def _pump(self, stream, is_err: bool) -> None:
        for line in stream:
            self.lines.append(line.rstrip("\n"))
            if is_err:
                self.err.append(line.rstrip("\n"))

    def wait_for(self, test, timeout: float = 1800) -> str:
        seen, deadline = 0, time.monotonic() + timeout
        while time.monotonic() < deadline:
            n = len(self.lines)
            for line in self.lines[seen:n]:
                if test(line):
                    return line
            seen = n
            if self.p.poll() is not None:
                time.sleep(0.5)
                if len(self.lines) == seen:
                    raise RuntimeError(f"exited {self.p.returncode} first:\n" + "\n".join(self.err[-40:]))
            time.sleep(0.2)
        raise TimeoutError("no such line:\n" + "\n".join(self.err[-40:]))

    def finish(self, timeout: float = 1800) -> int:
        try:
            rc = self.p.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(self.p.pid, signal.SIGKILL)
            raise
        for t in self._threads:
            t.join(timeout=10)
        return rc

    def said(self, *starts: str) -> list[str]:
        """The lines (stdout and stderr) that start with one of ``starts`` (after a ``[p0] ``-free strip)."""
        return [x for x in self.lines if x.lstrip("\r").startswith(starts)]


def version_line(v: int):
    def test(line: str) -> bool:
        if not line.startswith("{"):
            return False
        rec = json.loads(line)
        return rec.get("version") == v and rec.get("skipped") is False
    return test


def step_versions(run: Path) -> list[int]:
    return [r["version"] for r in map(json.loads, (run / "metrics.jsonl").read_text().splitlines())
            if r.get("kind") == "step" and not r.get("skipped_step")]


def final_params(run: Path, version: int):
    from sera_jax.training.checkpoint import Checkpointer
    ck = Checkpointer(run / "checkpoints")
    try:
        return ck.restore_model(version)[1]
    finally:
        ck.close()


def max_abs_diff(a, b) -> float:
    import jax
    la, lb = jax.tree_util.tree_leaves(a), jax.tree_util.tree_leaves(b)
    assert len(la) == len(lb)
    return max(float(np.max(np.abs(np.asarray(x, np.float64) - np.asarray(y, np.float64)))) for x, y in zip(la, lb))


def tracebacks(lines: list[str]) -> int:
    return sum(line.startswith("Traceback") for line in lines)


def env_workers(pid: int) -> list[int]:
    """The env worker processes under ``pid`` (direct children running ``envs_py.workers``)."""
    out = []
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            stat = (d / "stat").read_text()
            cmd = (d / "cmdline").read_bytes().replace(b"\0", b" ").decode()
        except OSError:
            continue
        ppid = int(stat.rsplit(")", 1)[1].split()[1])
        if ppid == pid and "envs_py.workers" in cmd:
            out.append(int(d.name))
    return sorted(out)


class Report:
    def __init__(self):
        self.parts: list[str] = []

    def add(self, text: str) -> None:
        print(text, flush=True)
        self.parts.append(text)

    def row(self, what: str, rc, lines) -> None:
        shown = " / ".join(f"`{x.strip()[:220]}`" for x in lines) or "(nothing)"
        self.add(f"| {what} | {rc} | {shown} |")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--steps", type=int, default=4, help="versions of each run (at least 3)")
    args = ap.parse_args()
    out: Path = args.out
    if out.exists():
        shutil.rmtree(out)
    out.mkdir(parents=True)
    # JAX_PLATFORMS=cpu: a venv with the aot extra (the CUDA plugin) would print its failed probe on every start.
    env = dict(os.environ, SERA_JAX_COMPILATION_CACHE=str(out / "xla"), JAX_PLATFORMS="cpu")
    rep = Report()
    from types import SimpleNamespace

    from sera_jax.profiling.machine import matmul_rate
    rate = matmul_rate(SimpleNamespace(hidden_size=2048, intermediate_size=2048)) / 1e9
    rep.add(f"# run-directory faults on the tiny config ({args.steps} versions)\n\nfp32 matmul ([1024, 2048] x "
            f"[2048, 2048]) at the start: {rate:.0f} GFLOP/s\n")

    ws = out / "warm"
    r = subprocess.run([*module("warmstart"), "--out", str(ws)], env=env, capture_output=True, text=True)
    assert r.returncode == 0, r.stderr[-3000:]
    n = args.steps
    train = [*module("train"), "warmstart.enabled=false", "rollout.tasks_per_step=1",
             "rollout.speculative_groups_per_rank=0", "train.warmup_micro_batches=[1]",
             "train.deterministic_scheduling=true", f"model.init_from={ws}", f"train.total_steps={n}"]

    # The uninterrupted reference.
    t0 = time.monotonic()
    ref = out / "uninterrupted"
    p = Proc([*train, "--out", str(ref)], env)
    assert p.finish() == 0, "\n".join(p.err[-40:])
    rep.add(f"uninterrupted run: versions {step_versions(ref)}, {time.monotonic() - t0:.0f} s\n")

    rep.add("| what happened to the run | exit | lines printed |\n|---|---|---|")
    run = out / "faulted"
    cmd = [*train, "--out", str(run)]
    # SIGTERM after version 1, then after version 2 (each a preemption).
    for v in (1, 2):
        p = Proc(cmd, env)
        start = p.wait_for(lambda x: x.startswith(("starting at version", "resuming from version")))
        p.wait_for(version_line(v))
        os.kill(p.p.pid, signal.SIGTERM)
        t0 = time.monotonic()
        rc = p.finish()
        rep.row(f"SIGTERM after version {v} (exit in {time.monotonic() - t0:.1f} s; tracebacks "
                f"{tracebacks(p.lines)})", rc, [start, *p.said("sera-train:")])
    # SIGKILL of the whole job during the next version's step: its records exist, its checkpoint does not.
    p = Proc(cmd, env)
    start = p.wait_for(lambda x: x.startswith("resuming from version"))
    p.wait_for(version_line(3))
    os.killpg(p.p.pid, signal.SIGKILL)
    rc = p.finish()
    before = step_versions(run)
    rep.row(f"SIGKILL after version 3's record (checkpoints kept: "
            f"{sorted(int(x.name) for x in (run / 'checkpoints').iterdir() if x.name.isdigit())}; metrics versions "
            f"{before})", rc, [start])
    # The resume after it, with a second writer started while it runs.
    p = Proc(cmd, env)
    start = p.wait_for(lambda x: x.startswith("resuming from version"))
    t0 = time.monotonic()
    second = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)
    second_s = time.monotonic() - t0
    rc = p.finish()
    warn = [x for x in p.lines if "stale lock" in x]
    rep.row("the resume after that SIGKILL (a stale lock left by the killed run)", rc, [*warn, start])
    rep.row(f"a second `sera-train` on the same directory meanwhile (exit in {second_s:.1f} s)", second.returncode,
            [x for x in second.stderr.splitlines() if x.startswith("sera-train:")])
    versions = step_versions(run)
    trees = sorted(x.name for x in (run / "trees").iterdir())
    a, b = final_params(ref, n), final_params(run, n)
    rep.add(f"\nAfter SIGTERM at 1 and 2 and SIGKILL at 3: `metrics.jsonl` step versions {versions} (before the "
            f"resume: {before}); tree files {len(trees)} for {len(versions)} steps; final parameters against the "
            f"uninterrupted run: max |Δ| = {max_abs_diff(a, b):.3g}\n")

    # The finished run rerun.
    t0 = time.monotonic()
    again = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)
    rep.add("| what happened to the run | exit | lines printed |\n|---|---|---|")
    rep.row(f"the same command on the finished run ({time.monotonic() - t0:.1f} s; tracebacks "
            f"{tracebacks(again.stderr.splitlines())})", again.returncode, again.stdout.splitlines()[-1:])

    # A truncated newest checkpoint: sera-eval without and with fallback, then training.
    torn = out / "torn"
    shutil.copytree(run, torn, ignore=shutil.ignore_patterns("run.lock"))
    params = torn / "checkpoints" / str(n) / "params"
    big = max((f for f in params.rglob("*") if f.is_file()), key=lambda f: f.stat().st_size)
    os.truncate(big, big.stat().st_size // 3)
    ev = [*module("eval"), "--checkpoint", str(torn), "--tasks", "2"]
    for flag, dest in ((["--no-fallback"], "eval_refused"), ([], "eval_fallback")):
        r = subprocess.run([*ev, *flag, "--out", str(out / dest)], env=env, capture_output=True, text=True)
        rep.row(f"`sera-eval {' '.join(flag)}` on a run whose newest checkpoint ({n}) is truncated (output folder "
                f"left: {(out / dest).exists()})", r.returncode,
                [x for x in r.stderr.splitlines() if x.startswith("sera-eval:") or "unreadable" in x])
    p = Proc([*train, "--out", str(torn)], env)
    rc = p.finish()
    rep.row("`sera-train` rerun on that run", rc,
            [x for x in p.lines if x.startswith(("sera-train:", "resuming", "starting")) or "unreadable" in x])
    c, d = final_params(torn, n), final_params(ref, n)
    rep.add(f"\nThe torn run retrained from its fallback: versions {step_versions(torn)}; final parameters against "
            f"the uninterrupted run: max |Δ| = {max_abs_diff(c, d):.3g}\n")

    # An env worker SIGKILLed mid-rollout (the default two task groups a step).
    killed = out / "worker_killed"
    p = Proc([*module("train"), "warmstart.enabled=false", f"model.init_from={ws}", "train.total_steps=1",
              "--out", str(killed)], env)
    p.wait_for(lambda x: x.startswith("starting at version"))
    deadline = time.monotonic() + 600
    while not env_workers(p.p.pid) and time.monotonic() < deadline:
        time.sleep(0.2)
    time.sleep(3)  # its trees are mid-rollout
    victims = env_workers(p.p.pid)
    os.kill(victims[0], signal.SIGKILL)
    rc = p.finish()
    rep.add("| what happened to the run | exit | lines printed |\n|---|---|---|")
    rep.row(f"SIGKILL of env worker pid {victims[0]} (of {len(victims)}) during version 0's rollouts", rc,
            [x for x in p.lines if "failed by infrastructure" in x])
    rep.add("\n" + credit_with_and_without(killed) + "\n")

    # A user's mistakes.
    bad = out / "bad.yaml"
    bad.write_text("train:\n  total_steps: 3\n  seed: [1, 2\n")
    empty = out / "empty_run"
    (empty / "checkpoints").mkdir(parents=True)
    cases = [
        ("a YAML syntax error", [*module("train"), str(bad), "--out", str(out / "u1")], out / "u1"),
        ("`sera-eval --checkpoint /nonexistent`", [*module("eval"), "--checkpoint", "/nonexistent", "--out",
                                                   str(out / "u2")], out / "u2"),
        ("`sera-export /nonexistent X`", [*module("export"), "/nonexistent", str(out / "u3")], out / "u3"),
        ("`sera-view /nonexistent.jsonl`", [*module("view"), "/nonexistent.jsonl"], None),
        ("an empty `checkpoints/`", [*module("eval"), "--checkpoint", str(empty), "--out", str(out / "u5")],
         out / "u5"),
        ("`model.init_from=/nonexistent` (warm start off: with it on, that path is where the warm start is built)",
         [*module("train"), "warmstart.enabled=false", "model.init_from=/nonexistent", "--out", str(out / "u6")],
         out / "u6"),
    ]
    rep.add("| a user's mistake | exit | lines printed (tracebacks; output folder left) |\n|---|---|---|")
    for what, c_, dest in cases:
        r = subprocess.run(c_, env=env, capture_output=True, text=True, timeout=600)
        lines = (r.stdout + r.stderr).splitlines()
        left = dest.exists() if dest is not None else "-"
        rep.row(f"{what} ({len(lines)} lines; tracebacks {tracebacks(lines)}; folder left {left})", r.returncode,
                [x for x in lines if "error" in x.lower()][:1])

    # Ctrl-C from a terminal (SIGINT to the whole process group) before the first version.
    p = Proc([*train, "--out", str(out / "ctrl_c")], env)
    p.wait_for(lambda x: x.startswith("starting at version 0"))
    time.sleep(2)
    os.killpg(p.p.pid, signal.SIGINT)
    rc = p.finish()
    rep.add("\n| what happened to the run | exit | lines printed |\n|---|---|---|")
    rep.row(f"Ctrl-C from a terminal before the first version ({len(p.err)} stderr lines; tracebacks "
            f"{tracebacks(p.lines)}; KeyboardInterrupt lines {sum('KeyboardInterrupt' in x for x in p.lines)})", rc,
            p.said("sera-train:"))
    (out / "report.md").write_text("\n".join(rep.parts) + "\n")


def credit_with_and_without(run: Path) -> str:
    """Version 0's execution datums credited over every tree of a group and without its infrastructure-failed
    trees (what the loop trains), from the run's own tree files."""
    from sera_jax.agents import infra, records
    from sera_jax.rl.baselines import task_group_credit
    from sera_jax.rl.stages import method_config

    trees = [t for f in sorted((run / "trees").glob("v000000_*.jsonl")) for t in records.read_jsonl(f)]
    groups: dict[str, list] = {}
    for t in trees:
        groups.setdefault(t.task_id, []).append(t)
    method = method_config("sera")  # the tiny default's method
    rows = []
    for task, group in groups.items():
        dead = [t for t in group if infra.failed(t)]
        if not dead:
            continue
        kept = [t for t in group if not infra.failed(t)]
        counts = []
        for zero_variance in (True, False):  # the loop's TextCraft rule (rejects all-equal groups), and without it
            allc = task_group_credit("execution", group, method, env="textcraft",
                                     filter_zero_variance=zero_variance)
            keptc = task_group_credit("execution", kept, method, env="textcraft",
                                      filter_zero_variance=zero_variance) if kept else None
            counts.append(f"{len(allc.datums) if allc.accepted else 0} / "
                          f"{len(keptc.datums) if keptc and keptc.accepted else 0}")
        rewards = [t.root.reward.environment for t in group]
        rows.append(f"| {task} | {len(group)} ({len(dead)}) | {rewards} | {counts[0]} | {counts[1]} |")
    head = ("| task | trees (failed by infrastructure) | root environment rewards | execution datums trained, all "
            "trees / without the failed ones (zero-variance filter on, the loop's rule) | the same without the filter "
            "|\n|---|---|---|---|---|\n")
    return head + "\n".join(rows) if rows else "no tree of version 0 was marked as an infrastructure failure"


if __name__ == "__main__":
    main()
