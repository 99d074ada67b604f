"""``sera-eval --endpoint`` end to end against real ``sera-serve`` processes of the shipped TextCraft warm start:
the pass builds the in-process engine's prompts on the same weights, requests spread over two replicas, trees record the
policy that played them with token ids, a SIGKILLed pass resumes keeping what it finished, two shards aggregate to their records in the
one-shard pass's order (refused, naming the missing shard, until both are done), ``--status`` reads a pass in progress, and
bad endpoints are one line each."""

from __future__ import annotations

import json
import os
import signal
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
TASKS = "6"
ENV = {**os.environ, "JAX_PLATFORMS": "cpu"}
GREEDY = "eval.temperature=0"  # the tiny default evaluates at 0.7: greedy, the two policies' passes must agree


def _eval(*args: str, timeout: float = 600) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "sera_jax.cli.eval", *args], env=ENV, capture_output=True,
                          text=True, timeout=timeout)


def _outcomes(out: Path) -> dict[str, bool | None]:
    rep = json.loads((out / "report.json").read_text())
    return {t["task_id"]: t["success"] for t in rep["tasks"][0]}


def _finished(directory: Path) -> dict[str, bool | None]:
    """The task records stored so far (results.jsonl, one run): task id → success."""
    path = directory / "results.jsonl"
    rows = [json.loads(x) for x in path.read_text().splitlines() if x.strip()] if path.exists() else []
    return {r["task_id"]: r["success"] for r in rows if "task_id" in r and "success" in r}


def _served(proc) -> int:
    return int(httpx.get(proc.url + "/metrics").json()["server"]["requests"].get("chat", 0))


@pytest.fixture(scope="module")
def replicas(run_dir):
    procs = [serve_process([str(run_dir)], *SERVE_FLAGS) for _ in range(2)]
    yield procs
    for p in procs:
        p.stop()


@pytest.fixture(scope="module")
def endpoint_pass(replicas, tmp_path_factory):
    """One uninterrupted endpoint pass over both replicas."""
    out = tmp_path_factory.mktemp("ep") / "pass"
    before = [_served(p) for p in replicas]
    t0 = time.monotonic()
    r = _eval("--endpoint", replicas[0].url, "--endpoint", replicas[1].url, "--model", "tiny_run",
              "--tasks", TASKS, "--runs", "1", "--out", str(out), GREEDY)
    assert r.returncode == 0, r.stderr[-3000:]
    return out, [_served(p) - b for p, b in zip(replicas, before)], time.monotonic() - t0, r


def test_endpoint_pass_equals_the_in_process_pass_and_uses_both_replicas(endpoint_pass, run_dir, tmp_path):
    out, served, _, r = endpoint_pass
    assert "RESULT env=textcraft tasks=6" in r.stdout and "errored=0" in r.stdout
    # round-robin: both replicas answered a share of the agents' turns
    assert min(served) > 0 and abs(served[0] - served[1]) <= 1, served
    # In process under the rule a chat server imposes: each prompt encoded from the conversation's text (the
    # endpoint pass turns env.token_history off, saying so).
    assert "env.token_history is off for a served policy" in r.stderr
    local = _eval("--checkpoint", str(run_dir), "--tasks", TASKS, "--runs", "1", "--out", str(tmp_path / "local"),
                  "env.token_history=false", GREEDY)
    assert local.returncode == 0, local.stderr[-3000:]
    # Greedy, the two passes are one: the same outcomes task for task, the same nodes, and every turn the same
    # prompt ids and the same completion text. (Not always the same completion ids: a served completion's ids are
    # its text encoded again, which may split where the engine's sampled tokens did not.)
    assert _outcomes(out) == _outcomes(tmp_path / "local")
    local_trees = {t.task_id: t for t in list(read_jsonl(tmp_path / "local" / "trees.jsonl"))}
    for tree in list(read_jsonl(out / "trees.jsonl")):
        theirs = local_trees[tree.task_id]
        assert tree.nodes.keys() == theirs.nodes.keys(), tree.task_id
        for node_id, node in tree.nodes.items():
            pairs = list(zip(node.turns, theirs.nodes[node_id].turns, strict=True))
            assert all(list(a.prompt_ids) == list(b.prompt_ids) for a, b in pairs), (tree.task_id, node_id)
            assert all(a.completion_text == b.completion_text for a, b in pairs), (tree.task_id, node_id)
    rep = json.loads((out / "report.json").read_text())
    assert rep["policy"]["kind"] == "endpoint" and rep["identity"]["policy"]["model"] == "tiny_run"
    assert rep["identity"]["policy"]["tokenizer_sha256"]  # the served tokenizer, fetched from sera-serve
    trees = list(read_jsonl(out / "trees.jsonl"))
    assert len(trees) == 6
    for tree in trees:
        assert tree.misc["policy"]["kind"] == "endpoint"
        turns = [t for n in tree.nodes.values() for t in n.turns]
        assert turns and all(t.completion_ids for t in turns)  # token ids: the served model's tokenizer is known
    stats = [t["stats"] for t in rep["tasks"][0]]
    assert all(s["served_completion_tokens"] > 0 and s["unmetered_turns"] == 0 for s in stats)
    # The server's own count of every prompt equals the ids the tree records: the trees say what the model saw.
    assert all(s["prompt_mismatch_turns"] == 0 for s in stats), stats


def test_killed_endpoint_pass_resumes_to_the_same_outcomes(endpoint_pass, replicas, tmp_path):
    out = tmp_path / "killed"
    args = ["--endpoint", replicas[0].url, "--model", "tiny_run", "--tasks", TASKS, "--runs", "1", "--out",
            str(out), "eval.concurrency=2"]
    p = subprocess.Popen([sys.executable, "-m", "sera_jax.cli.eval", *args], env=ENV, stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True)
    results = out / "results.jsonl"
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline and p.poll() is None:
        if results.exists() and len(results.read_text().splitlines()) >= 2:
            break
        time.sleep(0.2)
    assert p.poll() is None, "the pass ended before it could be killed"
    # while it runs: --status reads the pass without its lock
    st = _eval("--status", str(out), timeout=120)
    assert st.returncode == 0 and "6" in st.stdout, st.stdout + st.stderr
    p.send_signal(signal.SIGKILL)
    p.wait(60)
    kept = _finished(out)
    again = _eval(*args)
    assert again.returncode == 0, again.stderr[-3000:]
    line = next(x for x in again.stderr.splitlines() if x.startswith("sera-eval: resuming"))
    assert f"{len(kept)} of 6 finished trees kept" in line, line
    # the finished tasks were kept as they were (not run again); the others ran: every task once
    outcomes = _outcomes(out)
    assert outcomes.keys() == _outcomes(endpoint_pass[0]).keys()
    assert {k: outcomes[k] for k in kept} == kept
    assert len(list(read_jsonl(out / "trees.jsonl"))) == 6  # no tree twice, none lost
    # the same directory under another model is refused in one line, naming what differs
    other = _eval("--endpoint", replicas[0].url, "--model", "tiny_run", "--tasks", TASKS, "--runs", "1",
                  "--out", str(out), "eval.max_steps=3")
    assert other.returncode == 2 and "max_steps" in other.stderr, other.stderr[-2000:]


def test_two_shards_aggregate_to_the_one_shard_pass(endpoint_pass, replicas, tmp_path):
    out = tmp_path / "sharded"
    base = ["--model", "tiny_run", "--tasks", TASKS, "--runs", "1", "--out", str(out), "--num-shards", "2"]
    first = _eval("--endpoint", replicas[0].url, *base, "--shard-index", "0")
    assert first.returncode == 0, first.stderr[-3000:]
    early = _eval("--aggregate", str(out), timeout=120)
    assert early.returncode == 2 and "shard 1" in early.stderr, early.stderr[-2000:]
    second = _eval("--endpoint", replicas[1].url, *base, "--shard-index", "1")
    assert second.returncode == 0, second.stderr[-3000:]
    done = _eval("--aggregate", str(out), timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    shards = {**_finished(out / "shard-0-of-2"), **_finished(out / "shard-1-of-2")}
    assert len(shards) == 6 and _outcomes(out) == shards  # every shard's records, as stored
    assert list(_outcomes(out)) == list(_outcomes(endpoint_pass[0]))  # the picked order, shards interleaved back
    assert len(list(read_jsonl(out / "trees.jsonl"))) == 6


def test_bad_endpoints_are_one_line_each(replicas, tmp_path):
    unreachable = _eval("--endpoint", "http://127.0.0.1:9", "--model", "m", "--tasks", "1",
                        "--out", str(tmp_path / "u"), timeout=180)
    assert unreachable.returncode == 2, unreachable.stderr[-2000:]
    said = [x for x in unreachable.stderr.splitlines() if x.startswith("sera-eval: error")]
    assert len(said) == 1 and "127.0.0.1:9" in said[0] and "Traceback" not in unreachable.stderr
    wrong = _eval("--endpoint", replicas[0].url, "--model", "no-such-model", "--tasks", "1",
                  "--out", str(tmp_path / "w"), timeout=180)
    assert wrong.returncode == 2
    said = [x for x in wrong.stderr.splitlines() if x.startswith("sera-eval: error")]
    assert len(said) == 1 and "no-such-model" in said[0] and "tiny_run" in said[0], wrong.stderr[-2000:]
    bare = _eval("--endpoint", replicas[0].url, "--tasks", "1", "--out", str(tmp_path / "b"), timeout=120)
    assert bare.returncode == 2 and "endpoint.model" in bare.stderr and "Traceback" not in bare.stderr
