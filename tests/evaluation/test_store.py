"""The evaluation's output directory on its own (issue #54): appends that survive a kill (real children killed with
SIGKILL mid-block, between the trees and the record, in a loop), the repair on reopen (torn lines, orphan trees,
errored keys retried), the pinned identity and plan, the one-writer lock per shard, the partition into shards, and
the lock-free readers (--status, --aggregate's collect, the merged trees file)."""

import ast
import hashlib
import json
import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from sera_jax.agents.records import Node, Tree, Turn, loads_tree
from sera_jax.config.errors import UserError
from sera_jax.evaluation import store as store_module
from sera_jax.evaluation.store import (
    EvalStore,
    collect,
    format_status,
    merge_trees,
    partition_hash,
    shard_dir,
    shard_tasks,
    status,
)
from sera_jax.training.run_lock import RunLocked

REPO = Path(__file__).resolve().parents[2]
TASKS = [f"t{i}" for i in range(6)]
DIFFICULTY = {"t0": "easy", "t1": "easy", "t2": "easy", "t3": "hard", "t4": "hard", "t5": "hard"}
IDENT = {"policy": {"model": "a", "endpoint": "http://h:1/v1"}, "protocol": {"retries": 1, "max_steps": 20},
         "partition": partition_hash(TASKS)}


def _tree(run: int, task_id: str, attempt: int = 0, pad: int = 0) -> Tree:
    """Returns a one-node tree of ``task_id`` in run ``run``, as the protocol tags it (``misc["eval"]``)."""
    root = Node(id="root", goal=f"solve {task_id}", task_id=task_id,
                turns=[Turn(0, [1, 2, 3], [4, 5], [-0.25, -1.5], 0, completion_text="x" * pad)])
    return Tree(id=f"{task_id}#run{run}.{attempt}", task_id=task_id, root_id="root", nodes={"root": root},
                misc={"eval": {"run": run, "attempt": attempt, "error": None, "success": True}})


def _plan(tasks=TASKS, runs=1):
    return [((r, t), DIFFICULTY.get(t, "easy")) for r in range(runs) for t in tasks]


def _record(task_id: str, success, **extra) -> dict:
    return {"task_id": task_id, "difficulty": DIFFICULTY[task_id], "success": success, "attempts": 1, **extra}


def _lines(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def _tree_keys(path: Path) -> list[tuple[int, str]]:
    return [(t.misc["eval"]["run"], t.task_id) for t in map(loads_tree, path.read_text().splitlines())]


# --------------------------------------------------------------------------------------------- append, reopen

def test_append_then_reopen_keeps_every_finished_key_and_touches_nothing(tmp_path):
    out = tmp_path / "run"
    with EvalStore(out) as s:
        r = s.open(IDENT, _plan())
        assert (r.done, r.retry, r.dropped_trees, r.torn) == ({}, 0, 0, False)
        s.append((0, "t0"), _record("t0", True), [_tree(0, "t0"), _tree(0, "t0", 1)])
        s.append((0, "t3"), _record("t3", False, stats={"turns": 3}), [_tree(0, "t3")])
        s.append((0, "t1"), _record("t1", True), [])
        assert list(s.records()) == [(0, "t0"), (0, "t3"), (0, "t1")]
        written = s.records()
    assert s.directory == out  # one shard: the output directory itself
    before = {n: (out / n).read_bytes() for n in ("results.jsonl", "trees.jsonl", "plan.json", "identity.json")}
    assert _lines(out / "results.jsonl")[1] == {"run": 0, "task_id": "t3", "difficulty": "hard", "success": False,
                                                "attempts": 1, "stats": {"turns": 3}}
    assert json.loads(before["identity.json"]) == {**IDENT, "num_shards": 1}
    assert json.loads(before["plan.json"])[3] == {"run": 0, "task_id": "t3", "difficulty": "hard"}
    with EvalStore(out) as s:
        r = s.open(IDENT, _plan())
        assert r.done == written and (r.retry, r.dropped_trees, r.torn) == (0, 0, False)
        assert s.records() == written
    assert {n: (out / n).read_bytes() for n in before} == before  # nothing to drop: nothing rewritten
    assert _tree_keys(out / "trees.jsonl") == [(0, "t0"), (0, "t0"), (0, "t3")]


def test_reopen_retries_errored_keys_drops_orphans_and_cuts_torn_lines(tmp_path):
    out = tmp_path / "run"
    plan = _plan(runs=2)
    with EvalStore(out) as s:
        s.open(IDENT, plan)
        s.append((0, "t0"), _record("t0", True), [_tree(0, "t0")])
        s.append((0, "t1"), _record("t1", None, errors=["boom", "boom"]), [_tree(0, "t1"), _tree(0, "t1", 1)])
        s.append((1, "t0"), _record("t0", False), [_tree(1, "t0")])  # same task, another run: its own key
    # a kill between the two writes of (0, t2): its tree is on disk, its record never came; then a kill mid-write
    # of another tree, and (not at once in life, but each repaired the same way) a torn record line
    with open(out / "trees.jsonl", "a") as fh:
        fh.write(store_module.dumps_tree(_tree(0, "t2")) + "\n")
        fh.write(store_module.dumps_tree(_tree(0, "t4"))[:100])
    with open(out / "results.jsonl", "a") as fh:
        fh.write(json.dumps({"run": 0, "task_id": "t4", "success": True})[:20])
    warnings = []
    with EvalStore(out, warn=warnings.append) as s:
        r = s.open(IDENT, plan)
        assert set(r.done) == {(0, "t0"), (1, "t0")} and r.done[(1, "t0")]["success"] is False
        assert r.retry == 1 and r.torn
        assert r.dropped_trees == 4  # t1's two (errored), t2's orphan, t4's torn line
        assert [(x["run"], x["task_id"]) for x in _lines(out / "results.jsonl")] == [(0, "t0"), (1, "t0")]
        assert _tree_keys(out / "trees.jsonl") == [(0, "t0"), (1, "t0")]
        assert (out / "trees.jsonl").read_bytes().endswith(b"\n")
        # the retried key is appended as any other
        s.append((0, "t1"), _record("t1", True), [_tree(0, "t1", 0)])
    assert warnings == []  # the lock was released, not left stale
    with EvalStore(out) as s:
        r = s.open(IDENT, plan)
        assert set(r.done) == {(0, "t0"), (1, "t0"), (0, "t1")}
        assert (r.retry, r.dropped_trees, r.torn) == (0, 0, False)
    assert not list(out.glob(".*"))  # no temp file left behind


def test_a_last_line_that_is_not_json_is_torn_one_in_the_middle_is_refused(tmp_path):
    out = tmp_path / "run"
    with EvalStore(out) as s:
        s.open(IDENT, _plan())
        s.append((0, "t0"), _record("t0", True), [_tree(0, "t0")])
        s.append((0, "t1"), _record("t1", True), [_tree(0, "t1")])
    good = (out / "results.jsonl").read_bytes()
    (out / "results.jsonl").write_bytes(good + b"\0\0\0\0\n")  # a crash's zero-filled block, newline and all
    with EvalStore(out) as s:
        r = s.open(IDENT, _plan())
        assert r.torn and set(r.done) == {(0, "t0"), (0, "t1")} and r.dropped_trees == 0
    assert (out / "results.jsonl").read_bytes() == good
    first, second = good.splitlines(keepends=True)
    (out / "results.jsonl").write_bytes(first + b"{not json\n" + second)
    with pytest.raises(UserError, match=r"results\.jsonl line 2 is not a JSON record .*the file was edited"):
        EvalStore(out).open(IDENT, _plan())
    assert not status(out)["shards"][0]["locked"]  # the refusal released the lock


def test_append_refuses_what_open_would_later_drop(tmp_path):
    with EvalStore(tmp_path / "run") as s:
        with pytest.raises(RuntimeError, match="not open"):
            s.append((0, "t0"), _record("t0", True), [])
        s.open(IDENT, _plan())
        with pytest.raises(ValueError, match="not in this shard's plan"):
            s.append((0, "nope"), {"success": True}, [])
        with pytest.raises(ValueError, match="is not run 0 of task 't0'"):
            s.append((0, "t0"), _record("t0", True), [_tree(1, "t0")])
        with pytest.raises(ValueError, match="needs success"):
            s.append((0, "t0"), {"difficulty": "easy"}, [])
        with pytest.raises(ValueError, match="names run"):
            s.append((0, "t0"), _record("t1", True), [])
        s.append((0, "t0"), _record("t0", True), [_tree(0, "t0")])
        with pytest.raises(ValueError, match="already recorded"):
            s.append((0, "t0"), _record("t0", True), [])
        with pytest.raises(RuntimeError, match="already open"):
            s.open(IDENT, _plan())
    assert len(_lines(tmp_path / "run" / "results.jsonl")) == 1


def test_a_failed_write_is_cut_back_from_both_files(tmp_path, monkeypatch):
    out = tmp_path / "run"
    with EvalStore(out) as s:
        s.open(IDENT, _plan())
        s.append((0, "t0"), _record("t0", True), [_tree(0, "t0")])
        sizes = [(out / n).stat().st_size for n in ("trees.jsonl", "results.jsonl")]
        real, calls = store_module._write_all, []

        def full_disk(fd, data):
            calls.append(fd)
            if len(calls) == 2:  # the trees went out; the record meets a full disk after half of it
                os.write(fd, data[: len(data) // 2])
                raise OSError(28, "No space left on device")
            real(fd, data)

        monkeypatch.setattr(store_module, "_write_all", full_disk)
        with pytest.raises(OSError, match="No space"):
            s.append((0, "t1"), _record("t1", True), [_tree(0, "t1")])
        assert [(out / n).stat().st_size for n in ("trees.jsonl", "results.jsonl")] == sizes
        monkeypatch.setattr(store_module, "_write_all", real)
        s.append((0, "t1"), _record("t1", True), [_tree(0, "t1")])  # and the same key goes in whole
    with EvalStore(out) as s:
        r = s.open(IDENT, _plan())
        assert set(r.done) == {(0, "t0"), (0, "t1")} and (r.dropped_trees, r.torn) == (0, False)


# ------------------------------------------------------------------------------------------- real SIGKILLs

_CHILD = """
import os, signal, sys
sys.path.insert(0, {repo!r})
from tests.evaluation.test_store import IDENT, _plan, _record, _tree
from sera_jax.evaluation import store
out, mode, kill_at, pad = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
s = store.EvalStore(out)
s.open(IDENT, _plan(tasks=[f"t{{i}}" for i in range(400)]))
real, calls = store._write_all, [0]
def write_all(fd, data):
    calls[0] += 1
    if calls[0] == kill_at:
        if mode == "torn":
            os.write(fd, data[:-7])
        elif mode == "whole":
            real(fd, data)
        os.kill(os.getpid(), signal.SIGKILL)
    real(fd, data)
store._write_all = write_all
print("open", flush=True)
for i in range(400):
    s.append((0, f"t{{i}}"), {{"success": i % 3 != 0, "difficulty": "easy"}},
             [_tree(0, f"t{{i}}", 0, pad), _tree(0, f"t{{i}}", 1, pad)])
    print(f"t{{i}}", flush=True)
"""


def _child(out: Path, mode: str = "none", kill_at: int = 0, pad: int = 0) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", _CHILD.format(repo=str(REPO)), str(out), mode, str(kill_at),
                             str(pad)], stdout=subprocess.PIPE, text=True, cwd=REPO)


def _reopen(out: Path):
    s = EvalStore(out, warn=lambda m: None)
    r = s.open(IDENT, _plan(tasks=[f"t{i}" for i in range(400)]))
    s.close()
    return r


# write number k after open: odd k = the trees of key (k - 1) // 2, even k = its record
@pytest.mark.parametrize("mode,kill_at,done,dropped,torn", [
    ("torn", 5, 2, 2, True),     # killed in t2's trees: its first tree whole (an orphan), the second torn
    ("whole", 5, 2, 2, False),   # killed between t2's trees and its record: two orphans
    ("torn", 6, 2, 2, True),     # killed in t2's record: a torn record line, t2's two trees orphaned
    ("whole", 6, 3, 0, False),   # killed right after t2's record: t2 is finished
])
def test_a_child_killed_at_each_point_of_an_append_loses_only_that_key(tmp_path, mode, kill_at, done, dropped, torn):
    out = tmp_path / "run"
    child = _child(out, mode, kill_at)
    stdout, _ = child.communicate(timeout=120)
    assert child.returncode == -signal.SIGKILL
    assert stdout.split() == ["open"] + [f"t{i}" for i in range(min(done, 2))]
    r = _reopen(out)
    assert set(r.done) == {(0, f"t{i}") for i in range(done)}
    assert (r.dropped_trees, r.torn, r.retry) == (dropped, torn, 0)
    assert _tree_keys(out / "trees.jsonl") == [(0, f"t{i}") for i in range(done) for _ in range(2)]
    assert [x["task_id"] for x in _lines(out / "results.jsonl")] == [f"t{i}" for i in range(done)]


def test_a_loop_killed_mid_way_keeps_every_fully_appended_key(tmp_path):
    out = tmp_path / "run"
    child = _child(out, pad=200_000)  # two 200 kB trees a key: the kill lands in a write or an fsync
    try:
        assert child.stdout.readline().strip() == "open"
        printed = [child.stdout.readline().strip() for _ in range(12)]
    finally:
        child.send_signal(signal.SIGKILL)
        child.wait(timeout=30)
    r = _reopen(out)
    done = {t for _, t in r.done}
    assert set(printed) <= done and len(done) < 400
    assert r.retry == 0
    assert sorted(_tree_keys(out / "trees.jsonl")) == sorted((0, t) for t in done for _ in range(2))
    assert {x["task_id"] for x in _lines(out / "results.jsonl")} == done
    for (_, t), rec in r.done.items():
        assert rec["success"] is (int(t[1:]) % 3 != 0)


# ------------------------------------------------------------------------------------------ identity, plan

def test_a_different_identity_is_refused_in_one_line_naming_what_differs(tmp_path):
    out = tmp_path / "runs" / "x"
    with EvalStore(out) as s:
        s.open(IDENT, _plan())
    other = {**IDENT, "policy": {**IDENT["policy"], "model": "b"}}
    with pytest.raises(UserError) as e:
        EvalStore(out).open(other, _plan())
    assert str(e.value) == (f"{out} was evaluated with policy.model='a'; this command has policy.model='b': give "
                            "another --out or rerun the same command")
    many = {"policy": {"model": "b", "endpoint": "e"}, "protocol": {"retries": 2}, "partition": "p", "seed": 1}
    with pytest.raises(UserError) as e:
        EvalStore(out).open(many, _plan())
    msg = str(e.value)
    assert "\n" not in msg and msg.startswith(f"{out} was evaluated with policy.model='a', policy.endpoint=")
    assert "; this command has policy.model='b', policy.endpoint='e', protocol.retries=2 (and 3 more):" in msg
    with pytest.raises(UserError, match=r"was evaluated with num_shards=1; this command has num_shards=2"):
        EvalStore(out, num_shards=2, shard_index=1).open(IDENT, _plan())
    assert not (out / "shard-1-of-2").exists()  # the refused shard left no folder behind
    # a key order of its own is the same identity; a key only one side has is not
    same = {**IDENT, "policy": dict(reversed(list(IDENT["policy"].items()))), "extra": None}
    with pytest.raises(UserError, match=r"with no extra; this command has extra=None"):
        EvalStore(out).open(same, _plan())
    with EvalStore(out) as s:
        s.open({**IDENT, "protocol": dict(IDENT["protocol"])}, _plan())


def test_a_tuple_is_the_list_it_is_pinned_as(tmp_path):
    with EvalStore(tmp_path) as s:
        s.open({"tiers": ("easy", "hard")}, [])
    with EvalStore(tmp_path) as s:
        s.open({"tiers": ["easy", "hard"]}, [])


def test_another_plan_is_refused(tmp_path):
    with EvalStore(tmp_path) as s:
        s.open(IDENT, _plan())
    with pytest.raises(UserError, match=r"plan\.json holds another plan: its entry 0 is run 0 task 't0' \(easy\), "
                                        r"this command's is run 0 task 't1' \(easy\)"):
        EvalStore(tmp_path).open(IDENT, _plan(tasks=TASKS[1:]))
    with pytest.raises(UserError, match=r"holds another plan: 6 tasks where this command plans 12"):
        EvalStore(tmp_path).open(IDENT, _plan(runs=2))


def test_two_shards_pinning_at_once_agree_on_one_identity(tmp_path):
    """Both shards' first open race to create identity.json: one creates it, the other reads and compares."""
    a, b = EvalStore(tmp_path, num_shards=2, shard_index=0), EvalStore(tmp_path, num_shards=2, shard_index=1)
    a.open(IDENT, _plan(TASKS[0::2]))
    b.open(IDENT, _plan(TASKS[1::2]))
    a.close()
    b.close()
    assert json.loads((tmp_path / "identity.json").read_text()) == {**IDENT, "num_shards": 2}
    assert not list(tmp_path.glob(".identity*"))  # the link's temp file is gone


# ---------------------------------------------------------------------------------------------------- lock

_HOLD = """
import sys, time
sys.path.insert(0, {repo!r})
from sera_jax.evaluation.store import EvalStore
from tests.evaluation.test_store import IDENT, _plan, _record, _tree
s = EvalStore(sys.argv[1], num_shards=2, shard_index=1)
s.open(IDENT, _plan(["t1", "t3", "t5"]))
s.append((0, "t1"), _record("t1", True), [_tree(0, "t1")])
print("held", flush=True)
time.sleep(120)
"""


def test_a_live_writer_is_refused_by_name_and_a_killed_ones_lock_taken_over(tmp_path):
    holder = subprocess.Popen([sys.executable, "-c", _HOLD.format(repo=str(REPO)), str(tmp_path)],
                              stdout=subprocess.PIPE, text=True, cwd=REPO)
    try:
        assert holder.stdout.readline().strip() == "held"
        with pytest.raises(RunLocked, match=rf"shard-1-of-2 is being written by pid {holder.pid} on host "):
            EvalStore(tmp_path, num_shards=2, shard_index=1).open(IDENT, _plan(["t1", "t3", "t5"]))
        st = status(tmp_path)["shards"][1]
        assert st["locked"] and st["holder"]["pid"] == holder.pid and st["done"] == 1
        # the other shard is another writer's: free
        with EvalStore(tmp_path, num_shards=2, shard_index=0) as other:
            other.open(IDENT, _plan(["t0", "t2", "t4"]))
    finally:
        holder.kill()
        holder.wait(timeout=30)
    assert not status(tmp_path)["shards"][1]["locked"]  # a dead holder's record is not a lock
    warnings = []
    with EvalStore(tmp_path, num_shards=2, shard_index=1, warn=warnings.append) as s:
        r = s.open(IDENT, _plan(["t1", "t3", "t5"]))
        assert set(r.done) == {(0, "t1")}
        assert status(tmp_path)["shards"][1]["locked"]  # this process holds it now
    assert len(warnings) == 1 and "took over the stale lock" in warnings[0] and str(holder.pid) in warnings[0]


# ----------------------------------------------------------------------------------------------- partition

def test_shards_are_disjoint_cover_the_tasks_and_never_move():
    tasks = [f"task-{i}" for i in range(23)]
    for n in (1, 2, 3, 5, 23, 30):
        shards = [shard_tasks(tasks, n, i) for i in range(n)]
        assert sorted(t for s in shards for t in s) == sorted(tasks)
        assert sum(map(len, shards)) == len(tasks)  # disjoint
        assert shards == [shard_tasks(list(tasks), n, i) for i in range(n)]
        assert max(map(len, shards)) - min(map(len, shards)) <= 1
    assert shard_tasks(tasks, 3, 1) == ["task-1", "task-4", "task-7", "task-10", "task-13", "task-16", "task-19",
                                        "task-22"]
    for n, i in ((0, 0), (-1, 0), (2, 2), (2, -1), (True, 0), (2.0, 0)):
        with pytest.raises(UserError, match="--num-shards|--shard-index"):
            shard_tasks(tasks, n, i)
    assert partition_hash(["a", "b"]) == hashlib.sha256(b"a\nb").hexdigest() != partition_hash(["b", "a"])
    assert shard_dir("runs/x", 1, 0) == Path("runs/x") and shard_dir("runs/x", 4, 3) == Path("runs/x/shard-3-of-4")
    with pytest.raises(UserError):
        shard_dir("runs/x", 4, 4)


# --------------------------------------------------------------------------------------------------- readers

def _shard(out: Path, i: int, done: list[tuple[str, object]], hold: bool = False) -> EvalStore:
    s = EvalStore(out, num_shards=2, shard_index=i)
    s.open(IDENT, _plan(shard_tasks(TASKS, 2, i)))
    for t, success in done:
        s.append((0, t), _record(t, success), [_tree(0, t)])
    if not hold:
        s.close()
    return s


def test_status_collect_and_merge_while_shards_run_and_after(tmp_path):
    out = tmp_path / "runs" / "x"
    with pytest.raises(UserError, match=r"holds no evaluation \(no identity\.json\)"):
        status(out)
    writer = _shard(out, 0, [("t0", True), ("t2", None)], hold=True)  # shard 0: t0 t2 t4
    # a record half-written at this very moment: read around, not refused
    with open(out / "shard-0-of-2" / "results.jsonl", "a") as fh:
        fh.write('{"run": 0, "task_id": "t4", "succ')
    st = status(out)
    s0, s1 = st["shards"]
    assert s0["started"] and s0["locked"] and s0["holder"]["pid"] == os.getpid() and not s0["complete"]
    assert s0["by_difficulty"] == {"easy": {"done": 1, "errored": 1, "total": 2},
                                   "hard": {"done": 0, "errored": 0, "total": 1}}
    assert (s0["done"], s0["errored"], s0["total"]) == (1, 1, 3)
    assert not s1["started"] and not s1["locked"] and s1["total"] == 0 and not s1["complete"]
    assert st["by_difficulty"] == s0["by_difficulty"] and not st["complete"]
    host = s0["holder"]["host"]
    assert format_status(st).splitlines() == [
        f"shard 0 of 2 ({out}/shard-0-of-2): running (pid {os.getpid()} on {host}): easy 1/2 (1 errored), "
        "hard 0/1, all 1/3 (1 errored)",
        f"shard 1 of 2 ({out}/shard-1-of-2): missing",
        "all shards: incomplete (1 running, 1 missing): easy 1/2 (1 errored), hard 0/1, all 1/3 (1 errored)"]
    with pytest.raises(UserError) as e:
        collect(out)
    assert str(e.value) == (f"shard 0 of 2 ({out}/shard-0-of-2) is incomplete (running now): 1 of 3 tasks done, "
                            f"1 errored; shard 1 of 2 ({out}/shard-1-of-2) has not started: run those shards (the "
                            "same command with their --shard-index), then aggregate again")
    writer.close()  # killed or stopped: its torn line is still there, nobody writes it
    assert format_status(status(out)).splitlines()[0].startswith(f"shard 0 of 2 ({out}/shard-0-of-2): stopped: ")
    # the rerun of shard 0 cuts the torn line, keeps t0 and retries the errored t2
    s = EvalStore(out, num_shards=2, shard_index=0)
    r = s.open(IDENT, _plan(shard_tasks(TASKS, 2, 0)))
    assert set(r.done) == {(0, "t0")} and r.retry == 1 and r.torn
    s.append((0, "t2"), _record("t2", None), [_tree(0, "t2")])  # errored again, after its retries
    s.append((0, "t4"), _record("t4", False), [_tree(0, "t4")])
    s.close()
    st = status(out)
    assert st["shards"][0]["complete"] and st["shards"][0]["errored"] == 1  # every key recorded: complete
    with pytest.raises(UserError, match=r"^shard 1 of 2 \(.*shard-1-of-2\) has not started: run those shards"):
        collect(out)
    _shard(out, 1, [("t1", True), ("t3", True), ("t5", False)])
    st = status(out)
    assert st["complete"] and st["by_difficulty"] == {"easy": {"done": 2, "errored": 1, "total": 3},
                                                      "hard": {"done": 3, "errored": 0, "total": 3}}
    assert format_status(st).splitlines() == [
        f"shard 0 of 2 ({out}/shard-0-of-2): complete: easy 1/2 (1 errored), hard 1/1, all 2/3 (1 errored)",
        f"shard 1 of 2 ({out}/shard-1-of-2): complete: easy 1/1, hard 2/2, all 3/3",
        "all shards: complete: easy 2/3 (1 errored), hard 3/3, all 5/6 (1 errored)"]
    identity, shards = collect(out)
    assert identity == {**IDENT, "num_shards": 2}
    assert list(shards[0]) == [(0, "t0"), (0, "t2"), (0, "t4")] and list(shards[1]) == [(0, "t1"), (0, "t3"),
                                                                                         (0, "t5")]
    assert shards[0][(0, "t2")]["success"] is None and shards[1][(0, "t5")]["success"] is False
    merged = merge_trees(out)
    assert merged == out / "trees.jsonl"
    assert merged.read_bytes() == b"".join((out / f"shard-{i}-of-2" / "trees.jsonl").read_bytes() for i in (0, 1))
    assert [t.task_id for t in map(loads_tree, merged.read_text().splitlines())] == ["t0", "t2", "t4", "t1", "t3",
                                                                                     "t5"]


def test_one_shard_reads_as_the_directory_itself(tmp_path):
    with EvalStore(tmp_path) as s:
        s.open(IDENT, _plan(["t0", "t3"]))
        s.append((0, "t0"), _record("t0", True), [_tree(0, "t0")])
    assert format_status(status(tmp_path)) == f"{tmp_path}: stopped: easy 1/1, hard 0/1, all 1/2"
    with pytest.raises(UserError, match=rf"^the evaluation \({re.escape(str(tmp_path))}\) is incomplete: 1 of 2 "
                                        "tasks done: rerun the same command$"):
        collect(tmp_path)
    with EvalStore(tmp_path) as s:
        s.open(IDENT, _plan(["t0", "t3"]))
        s.append((0, "t3"), _record("t3", True), [_tree(0, "t3")])
    before = (tmp_path / "trees.jsonl").read_bytes()
    assert merge_trees(tmp_path) == tmp_path / "trees.jsonl" and (tmp_path / "trees.jsonl").read_bytes() == before
    assert format_status(status(tmp_path)) == f"{tmp_path}: complete: easy 1/1, hard 1/1, all 2/2"
    assert [list(x) for x in collect(tmp_path)[1]] == [[(0, "t0"), (0, "t3")]]


def test_merge_leaves_out_a_torn_last_tree_line(tmp_path):
    _shard(tmp_path, 0, [("t0", True)])
    _shard(tmp_path, 1, [("t1", True)])
    with open(tmp_path / "shard-0-of-2" / "trees.jsonl", "a") as fh:
        fh.write('{"id": "torn')
    assert _tree_keys(merge_trees(tmp_path)) == [(0, "t0"), (0, "t1")]


def test_the_store_imports_no_jax_and_nothing_above_evaluation():
    tree = ast.parse(Path(store_module.__file__).read_text())
    names = {a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
    names |= {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)}
    ours = {n for n in names if n.split(".")[0] == "sera_jax"}
    assert ours == {"sera_jax.agents.records", "sera_jax.config.errors", "sera_jax.training.run_lock"}
    assert all(n.split(".")[0] in sys.stdlib_module_names or n == "__future__" for n in names - ours)
