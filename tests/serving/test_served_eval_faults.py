"""``sera-eval --endpoint`` when things go wrong, against real servers in their own processes: a ``sera-serve`` that
dies mid-pass (the pass ends with errored trees, says it is incomplete, and a rerun after a restart on the same port
retries exactly those), a server that answers HTTP 500 and bodies that are not JSON to some requests (a real
Starlette/uvicorn proxy, ``faulty_proxy.py``, in front of ``sera-serve``), and a SIGTERMed pass (exit 143; the rerun's
report equals an uninterrupted pass's, task for task and token for token; in process, where batches repeat)."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from sera_jax.agents.records import read_jsonl
from sera_jax.serving.process import serve_process
from tests.serving.conftest import SERVE_FLAGS

pytestmark = pytest.mark.slow
ROOT = Path(__file__).resolve().parents[2]
ENV = {**os.environ, "JAX_PLATFORMS": "cpu"}
TASKS = "6"
# One tree at a time: a single-row server sees one request sequence, so a pass's outcomes are reproducible.
QUIET = ["eval.concurrency=1", "endpoint.backoff_s=0.1"]


def _eval(*args: str, timeout: float = 600) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "sera_jax.cli.eval", *args], env=ENV, capture_output=True,
                          text=True, timeout=timeout)


def _start(*args: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "sera_jax.cli.eval", *args], env=ENV, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)


def _records(out: Path) -> dict[str, dict]:
    """The stored task records (the last one per task): task id → record."""
    path = out / "results.jsonl"
    rows = [json.loads(x) for x in path.read_text().splitlines() if x.strip()] if path.exists() else []
    return {r["task_id"]: r for r in rows if "task_id" in r and "success" in r}


def _wait_for_records(p: subprocess.Popen, out: Path, n: int, timeout_s: float = 300) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline and p.poll() is None:
        if len(_records(out)) >= n:
            return
        time.sleep(0.2)
    raise AssertionError(f"the pass ended or stalled before {n} records (rc {p.poll()})")


def _report(out: Path) -> dict:
    return json.loads((out / "report.json").read_text())


def _by_task(out: Path) -> dict[str, tuple]:
    """task id → (success, completion tokens of its tree) from the report."""
    return {t["task_id"]: (t["success"], t["stats"].get("completion_tokens")) for t in _report(out)["tasks"][0]}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def server(run_dir):
    proc = serve_process([str(run_dir)], *SERVE_FLAGS)
    yield proc
    proc.stop()


@pytest.fixture(scope="module")
def straight(tmp_path_factory):
    """An uninterrupted in-process pass of the shipped warm start (the tiny default's policy), one tree at a time."""
    out = tmp_path_factory.mktemp("straight") / "pass"
    r = _eval("--tasks", TASKS, "--runs", "1", "--out", str(out), "eval.concurrency=1")
    assert r.returncode == 0, r.stderr[-3000:]
    return out


def test_a_sigtermed_pass_exits_143_and_its_rerun_equals_an_uninterrupted_pass(straight, tmp_path):
    # In process: the engine's batches are the same in both passes, so the outcomes must be too. (Through a server
    # they need not be: its batches mix whatever requests are in flight, and a tiny model's greedy near-ties flip.)
    out = tmp_path / "termed"
    args = ["--tasks", TASKS, "--runs", "1", "--out", str(out), "eval.concurrency=1"]
    p = _start(*args)
    _wait_for_records(p, out, 2)
    p.send_signal(signal.SIGTERM)
    _, err = p.communicate(timeout=120)
    assert p.returncode == 143, err[-3000:]
    assert "every finished tree is saved" in err and "Traceback" not in err
    kept = _records(out)
    assert 2 <= len(kept) < 6 and not (out / "report.json").exists()  # no report of a part of the pass
    again = _eval(*args)
    assert again.returncode == 0, again.stderr[-3000:]
    assert f"{len(kept)} of 6 finished trees kept (skipped), 0 errored to retry, {6 - len(kept)} to run" in \
        again.stderr
    # Task for task, and token for token, the resumed pass is the uninterrupted one.
    assert _by_task(out) == _by_task(straight)
    rep, base = _report(out), _report(straight)
    assert rep["complete"] and rep["runs"] == base["runs"] and rep["mean_std"] == base["mean_std"]
    assert len(list(read_jsonl(out / "trees.jsonl"))) == 6


def test_a_server_that_dies_mid_pass_leaves_errored_trees_that_a_rerun_retries(run_dir, tmp_path):
    port = _free_port()
    srv = serve_process([str(run_dir)], *SERVE_FLAGS, port=port)
    out = tmp_path / "died"
    args = ["--endpoint", srv.url, "--model", "tiny_run", "--tasks", TASKS, "--runs", "1", "--out", str(out),
            *QUIET, "endpoint.retries=1", "endpoint.timeout_s=60"]
    try:
        p = _start(*args)
        _wait_for_records(p, out, 2)
        srv.kill()  # SIGKILL, as a crash or a lost machine
        _, err = p.communicate(timeout=300)
        # The pass ran to its end: the tasks after the death errored (their retries spent), the pass says it is
        # incomplete, and its report says so beside the failures it counts.
        assert p.returncode == 1, err[-3000:]
        assert "Traceback" not in err
        recs = _records(out)
        errored = sorted(t for t, r in recs.items() if r["success"] is None)
        finished = {t: r["success"] for t, r in recs.items() if r["success"] is not None}
        assert len(recs) == 6 and errored and len(finished) >= 2
        assert f"incomplete: {len(errored)} tree(s) errored" in err
        assert all(f"127.0.0.1:{port}" in " ".join(recs[t]["errors"]) for t in errored), [recs[t] for t in errored]
        rep = _report(out)
        assert rep["complete"] is False and rep["errored"] == len(errored)
        assert "**Incomplete**" in (out / "report.md").read_text()
        st = _eval("--status", str(out), timeout=120)
        assert st.returncode == 0 and f"({len(errored)} errored)" in st.stdout, st.stdout

        srv = serve_process([str(run_dir)], *SERVE_FLAGS, port=port)  # the same server back, on the same port
        again = _eval(*args)
        assert again.returncode == 0, again.stderr[-3000:]
        assert (f"{len(finished)} of 6 finished trees kept (skipped), {len(errored)} errored to retry, "
                f"{len(errored)} to run") in again.stderr, again.stderr[-2000:]
        rep = _report(out)
        assert rep["complete"] and rep["errored"] == 0
        after = {t["task_id"]: t["success"] for t in rep["tasks"][0]}
        assert {t: after[t] for t in finished} == finished and all(after[t] is not None for t in errored)
        # the report's trees: one per task, the errored attempts dropped with their records
        assert sorted(t.task_id for t in read_jsonl(out / "trees.jsonl")) == sorted(recs)
    finally:
        srv.kill()


def test_a_server_answering_500_and_garbage_costs_trees_never_the_pass(server, tmp_path):
    port = _free_port()
    proxy = subprocess.Popen([sys.executable, "-m", "tests.serving.faulty_proxy", "--upstream", server.url,
                              "--port", str(port), "--fail-every", "4", "--garbage-every", "7"],
                             cwd=ROOT, env=ENV, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                if httpx.get(url + "/health", timeout=2.0).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            assert time.monotonic() < deadline and proxy.poll() is None, "the proxy did not start"
            time.sleep(0.2)
        out = tmp_path / "faulty"
        base = ["--model", "tiny_run", "--tasks", "4", "--runs", "1", "--out", str(out), *QUIET,
                "endpoint.retries=0", "eval.retries=0"]
        r = _eval("--endpoint", url, *base)
        assert "Traceback" not in r.stderr
        recs = _records(out)
        assert len(recs) == 4
        said = (out / "trees.jsonl").read_text() + json.dumps(recs)
        # the spoiled replies reached the agents as failures naming what was wrong (a root's: its tree errored)
        assert "HTTP 500" in said and "injected failure" in said and "malformed response" in said
        errored = [t for t, rec in recs.items() if rec["success"] is None]
        assert errored, "a spoiled root reply must error its tree"
        assert r.returncode == 1 and f"incomplete: {len(errored)} tree(s) errored" in r.stderr, r.stderr[-3000:]
        # the same command through a healthy server retries those trees and completes the pass
        again = _eval("--endpoint", server.url, *base)
        assert again.returncode == 0, again.stderr[-3000:]
        assert f"{len(errored)} errored to retry" in again.stderr
        assert _report(out)["complete"] and len(_report(out)["tasks"][0]) == 4
    finally:
        proxy.kill()
        proxy.wait()
