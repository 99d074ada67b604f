"""Issue #48's faults done to a real ``sera-train`` subprocess on the tiny config, from the shipped warm start, with
bounded waits: SIGTERM after version 1 (a preemption: saved, exit 143), SIGKILL mid-step and the resume that cuts
the records back, a second writer refused while the first runs, the finished run's rerun, Ctrl-C from a terminal
before the first version (the whole process group: no abort, no worker traceback), and a truncated newest
checkpoint in ``sera-eval`` (reported in one line, the older version evaluated; ``--no-fallback`` refuses).

One run directory is reused through the steps of the first test; the subprocesses share one compilation cache."""

import json
import re
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

# One task group per step and no speculative one: a step's rollout is short and the engine has fewer shapes to compile.
TRAIN = [sys.executable, "-m", "sera_jax.cli.train", "warmstart.enabled=false", "rollout.tasks_per_step=1",
         "rollout.speculative_groups_per_rank=0", "train.warmup_micro_batches=[1]"]


class Proc:
    """A command with its stdout and stderr lines collected as they come."""

    def __init__(self, cmd, env):
        self.p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
                                  start_new_session=True)  # its own process group, as a terminal job has
        self.out, self.err, self.lines = [], [], []  # self.lines: both streams, in arrival order
        self._threads = [threading.Thread(target=self._pump, args=(s, d), daemon=True)
                         for s, d in ((self.p.stdout, self.out), (self.p.stderr, self.err))]
        for t in self._threads:
            t.start()

    def _pump(self, stream, dest):
        for line in stream:
            dest.append(line)
            self.lines.append(line)

    def wait_for(self, test, timeout: float) -> str:
        """Returns the first stdout/stderr line passing ``test``; fails after ``timeout`` s or when the process
        ends first."""
        deadline = time.monotonic() + timeout
        seen = 0
        while time.monotonic() < deadline:
            n = len(self.lines)
            for line in self.lines[seen:n]:
                if test(line):
                    return line
            seen = n
            if self.p.poll() is not None:
                time.sleep(0.3)  # let the pumps drain
                if len(self.lines) == seen:
                    pytest.fail(f"exited {self.p.returncode} first:\n{self.stderr()[-3000:]}")
            time.sleep(0.2)
        pytest.fail(f"no such line within {timeout} s:\n{self.stderr()[-3000:]}")

    def finish(self, timeout: float) -> int:
        """Returns the exit status (kills the process group and fails after ``timeout`` s)."""
        try:
            rc = self.p.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(self.p.pid, signal.SIGKILL)
            pytest.fail(f"still running after {timeout} s:\n{self.stderr()[-3000:]}")
        for t in self._threads:
            t.join(timeout=10)
        return rc

    def stderr(self) -> str:
        return "".join(self.err).replace("\r", "\n")


def _version_line(v: int):
    def test(line: str) -> bool:
        if not line.startswith("{"):
            return False
        rec = json.loads(line)
        return rec.get("version") == v and rec.get("skipped") is False
    return test


def _steps(run: Path) -> list[tuple[int, bool]]:
    return [(r["version"], r["skipped_step"]) for r in map(json.loads, (run / "metrics.jsonl").read_text().splitlines())
            if r["kind"] == "step"]


@pytest.fixture(scope="module")
def env(tmp_path_factory):
    """The subprocesses' environment: one compilation cache for all of them (the first run compiles)."""
    return dict(os.environ, SERA_JAX_COMPILATION_CACHE=str(tmp_path_factory.mktemp("xla")))


@pytest.fixture(scope="module")
def warm_start(tmp_path_factory, env):
    """A run directory holding the shipped warm start (copied by sera-warmstart, no training)."""
    ws = tmp_path_factory.mktemp("ws") / "warm"
    out = subprocess.run([sys.executable, "-m", "sera_jax.cli.warmstart", "--out", str(ws)], env=env,
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    return ws


@pytest.mark.slow
def test_preemption_kill_resume_second_writer_and_finished_rerun(tmp_path, env, warm_start):
    run = tmp_path / "run"
    cmd = [*TRAIN, f"model.init_from={warm_start}", "train.total_steps=3", "--out", str(run)]

    # SIGTERM after version 1: the loop saves version 1 and the command says so, exit 143
    p = Proc(cmd, env)
    p.wait_for(_version_line(1), timeout=600)
    os.kill(p.p.pid, signal.SIGTERM)
    assert p.finish(timeout=120) == 143
    assert "sera-train: terminated (SIGTERM); version 1 saved; the same command resumes" in p.stderr()
    assert "Traceback" not in p.stderr() and (run / "checkpoints" / "1").is_dir()

    # SIGKILL during version 2's successor: version 2's records exist, its checkpoint does not (every 5)
    p = Proc(cmd, env)
    p.wait_for(lambda line: line.startswith("resuming from version 1 (of 3)"), timeout=300)
    p.wait_for(_version_line(2), timeout=600)
    os.killpg(p.p.pid, signal.SIGKILL)
    p.finish(timeout=60)
    assert sorted(x.name for x in (run / "checkpoints").iterdir() if x.name.isdigit()) == ["1"]
    assert [v for v, skipped in _steps(run) if not skipped] == [1, 2]

    # the resume cuts version 2's records; a second writer meanwhile is refused at once, naming the holder
    p = Proc(cmd, env)
    line = p.wait_for(lambda line: line.startswith("resuming from version 1"), timeout=300)
    assert "records cut back to the checkpoint" in line and "TensorBoard events rewritten" in line
    t0 = time.monotonic()
    second = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=120)
    assert second.returncode == 2, second.stderr[-2000:]
    err = [x for x in second.stderr.splitlines() if x.startswith("sera-train:")]
    assert err and err[0].startswith(f"sera-train: error: {run} is being written by pid {p.p.pid} on host ")
    assert "sera_jax.cli.train" in err[0] and time.monotonic() - t0 < 60
    assert p.finish(timeout=600) == 0, p.stderr()[-3000:]
    steps = _steps(run)
    assert [v for v, skipped in steps if not skipped] == [1, 2, 3]  # every version once
    assert len(list((run / "trees").iterdir())) == len(steps)  # one tree file per attempt recorded

    # the finished run's rerun: one line, exit 0, nothing compiled
    t0 = time.monotonic()
    again = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=120)
    assert again.returncode == 0, again.stderr[-2000:]
    assert again.stdout.strip() == f"sera-train: already at version 3 of 3 in {run}; nothing to do"
    assert time.monotonic() - t0 < 60

    # a truncated newest checkpoint: sera-eval reports it in one line and evaluates the newest intact version
    params = run / "checkpoints" / "3" / "params"
    big = max((f for f in params.rglob("*") if f.is_file()), key=lambda f: f.stat().st_size)
    os.truncate(big, big.stat().st_size // 3)
    ev = [sys.executable, "-m", "sera_jax.cli.eval", "--checkpoint", str(run), "--tasks", "1"]
    refused = subprocess.run([*ev, "--no-fallback", "--out", str(tmp_path / "e1")], env=env, capture_output=True,
                             text=True, timeout=300)
    assert refused.returncode == 2 and not (tmp_path / "e1").exists()
    lines = [x for x in refused.stderr.splitlines() if x.startswith("sera-eval:")]
    assert len(lines) == 1 and "checkpoint version 3 is unreadable: " in lines[0] and str(params) in lines[0]
    # No traceback of ours. (Orbax's own shard readers, still failing on uvloop threads as the process ends, may
    # print theirs: the error they repeat is the one reported above.)
    assert "fallback refused" in lines[0] and not re.search(r'File "[^"]*/sera_jax/', refused.stderr)
    ok = subprocess.run([*ev, "--out", str(tmp_path / "e2")], env=env, capture_output=True, text=True, timeout=600)
    assert ok.returncode == 0, ok.stderr[-3000:]
    said = [x for x in ok.stderr.splitlines() if "checkpoint version 3 is unreadable" in x]
    assert len(said) == 1 and said[0].endswith("falling back to version 1")
    assert json.loads((tmp_path / "e2" / "report.json").read_text())["source"].endswith("version 1")


@pytest.mark.slow
def test_ctrl_c_from_a_terminal_before_the_first_version(tmp_path, env, warm_start):
    """SIGINT to the whole process group while the train step still compiles in the background and the first
    rollout runs: exit 130 with the resume line; no interpreter abort, no env worker traceback."""
    run = tmp_path / "run"
    p = Proc([*TRAIN, f"model.init_from={warm_start}", "train.total_steps=2", "--out", str(run)], env)
    p.wait_for(lambda line: line.startswith("starting at version 0 of 2"), timeout=300)
    time.sleep(2)  # the rollout's env workers are up
    os.killpg(p.p.pid, signal.SIGINT)
    rc = p.finish(timeout=300)
    err = p.stderr()
    assert rc == 130, err[-3000:]
    assert "sera-train: interrupted; " in err
    assert "Traceback" not in err and "KeyboardInterrupt" not in err and "terminate called" not in err


@pytest.mark.slow
def test_sigterm_to_a_background_warm_start_build(tmp_path, env):
    """``sera-warmstart`` building a warm start (a recipe other than the shipped one), started the way a script
    starts a background job (SIGINT ignored): SIGTERM ends it with 143 and one line, and the folder it created and
    had not written to yet is gone."""
    out = tmp_path / "ws"
    p = subprocess.Popen([sys.executable, "-m", "sera_jax.cli.warmstart", "warmstart.steps=37", "--out", str(out)],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
                         preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_IGN))
    deadline = time.monotonic() + 300
    while not (out / "run.lock").is_file() and p.poll() is None and time.monotonic() < deadline:
        time.sleep(0.2)  # the lock is taken once the command has set up its signal handling
    assert p.poll() is None, p.stderr.read()[-2000:]
    time.sleep(2)
    p.send_signal(signal.SIGTERM)
    _, err = p.communicate(timeout=180)
    assert p.returncode == 143, err[-3000:]
    assert "sera-warmstart: terminated (SIGTERM); the same command starts the warm start again" in err
    assert "Traceback" not in err and not out.exists()


_GC_SIGTERM = """
import gc, os, signal, time
from sera_jax.cli import preemption
preemption.install(direct=True)
sent = []
def callback(phase, info):
    if phase == "start" and not sent:
        sent.append(1)
        os.kill(os.getpid(), signal.SIGTERM)
        for _ in range(1000):  # Python code inside the gc callback: the handler runs, and raises, here
            pass
gc.callbacks.append(callback)
t0 = time.monotonic()
try:
    while time.monotonic() - t0 < 20:
        gc.collect()
        time.sleep(0.01)
    print("ran on")
except KeyboardInterrupt:
    print("stopped", preemption.exit_status())
"""


def test_a_sigterm_landing_in_a_gc_callback_still_stops_the_command(env):
    """Python ignores exceptions raised in gc callbacks (jax registers one), so the KeyboardInterrupt a SIGTERM
    raises there would be lost and the command would run on (seen: a warm-start build that finished after its
    SIGTERM); the signal is delivered again from outside the callback."""
    out = subprocess.run([sys.executable, "-c", _GC_SIGTERM], capture_output=True, text=True, env=env, timeout=120)
    assert out.stdout.strip() == "stopped 143", out.stdout + out.stderr[-2000:]
