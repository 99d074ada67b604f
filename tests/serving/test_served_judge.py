"""The judge path end to end against a ``sera-serve`` process serving the frozen TextWorld warm start: the RAO
family's sub-agent labels (``SubagentJudge.label_subagents``) and the RT stage's deferred branch labels
(``SubagentJudge.label_fork_groups``, with the judge's retries) through the httpx ``ChatJudge``; at temperature 0
its labels equal the in-process ``policy_frozen`` judge's on the same requests, with
the same token counts; the server killed mid-run leaves the affected sub-agents untrainable and counted, the trees
whole, and labels resume once it is back; a hanging judge is bounded by its timeout."""

from __future__ import annotations

import asyncio
import socket
import threading
import time

import httpx
import pytest

from sera_jax.agents.judge import ChatJudge, JudgeUnavailable, PolicyJudge, frozen_policy_engine
from sera_jax.agents.subagent_judge import SPENT_KEY, SubagentJudge
from sera_jax.interop.export import import_pretrained
from sera_jax.serving.policy import load_served_policy
from sera_jax.serving.process import serve_process
from sera_jax.serving.server import ServeOptions, engine_config
from sera_jax.training.stats import tree_metrics
from sera_jax.warmstart.sft import SHIPPED_DIRS
from tests.serving.judge_trees import fork_group_trees, judge_trees

pytestmark = pytest.mark.slow
FLAGS = ("--max-batch", "16", "--max-context", "2048")
JUDGE = dict(temperature=0.0, max_attempts=1, style="compact")   # the tiny TextWorld config's execution judge
RT_JUDGE = dict(temperature=0.0, max_attempts=3, style="compact")  # the RT stage's branch labels: with retries
MAX_TOKENS = 48


@pytest.fixture(scope="module")
def tw_run(tmp_path_factory):
    return import_pretrained(SHIPPED_DIRS["textworld_sync"], tmp_path_factory.mktemp("tw") / "tiny_textworld")


def records(trees):
    return {(t.id, n.id): n.misc.get(SPENT_KEY) for t in trees for n in t.nodes.values() if n.id != "root"}


def test_served_labels_equal_the_policy_frozen_judge(tw_run, capsys):
    trees_http, trees_local = judge_trees(8), judge_trees(8)
    forks_http, forks_local = fork_group_trees(4), fork_group_trees(4)
    proc = serve_process([str(tw_run)], *FLAGS)
    try:
        model = httpx.get(proc.url + "/v1/models").json()["data"][0]["id"]
        chat = ChatJudge(proc.url + "/v1", model, max_tokens=MAX_TOKENS, timeout_s=60, backoff_s=0.05, **JUDGE)
        asyncio.run(chat.ensure_reachable())
        http_totals = asyncio.run(SubagentJudge(chat).label_subagents(trees_http))
        rt_chat = ChatJudge(proc.url + "/v1", model, max_tokens=MAX_TOKENS, timeout_s=60, backoff_s=0.05,
                            **RT_JUDGE)
        http_rt = asyncio.run(SubagentJudge(rt_chat).label_fork_groups(forks_http))
    finally:
        proc.stop()
    policy = load_served_policy(tw_run)
    engine = frozen_policy_engine(policy.model_cfg, policy.params,
                                  engine_config(policy.model_cfg, ServeOptions(max_batch=16, max_context=2048)),
                                  policy.tokenizer)
    try:
        local = PolicyJudge(engine, policy.tokenizer, max_new_tokens=MAX_TOKENS, max_prompt_tokens=2048 - MAX_TOKENS,
                            **JUDGE)
        local_totals = asyncio.run(SubagentJudge(local).label_subagents(trees_local))
        rt_local = PolicyJudge(engine, policy.tokenizer, max_new_tokens=MAX_TOKENS,
                               max_prompt_tokens=2048 - MAX_TOKENS, **RT_JUDGE)
        local_rt = asyncio.run(SubagentJudge(rt_local).label_fork_groups(forks_local))
    finally:
        engine.close()
    got, want = records(trees_http), records(trees_local)
    n = len(got)
    same = sum(got[k]["success"] == want[k]["success"] and got[k]["reason"] == want[k]["reason"] for k in got)
    m = tree_metrics(trees_http, env="textworld_sync")
    with capsys.disabled():
        print(f"\nserved judge vs policy_frozen at temperature 0: {same}/{n} labels equal; "
              f"labelled {http_totals['labelled']}/{n} (true {sum(r['success'] is True for r in got.values())}); "
              f"run metrics: " + ", ".join(f"{k}={v:g}" for k, v in sorted(m.items()) if "judge" in k))
    assert n == 24 and same == n
    assert [(r["prompt_tokens"], r["completion_tokens"]) for r in got.values()] == \
        [(r["prompt_tokens"], r["completion_tokens"]) for r in want.values()]
    assert http_totals == local_totals and http_totals["labelled"] > 0
    assert m["supervision/execution_judge_calls"] == n and m["supervision/execution_judge_unmetered_calls"] == 0
    # The RT stage: every branch of every complete fork group gets the label the in-process judge gives it.
    got_b = [(b.trajectory_id, b.success) for t in forks_http for g in t.fork_groups for b in g.branches]
    want_b = [(b.trajectory_id, b.success) for t in forks_local for g in t.fork_groups for b in g.branches]
    m_rt = tree_metrics(forks_http, env="textworld_sync")
    with capsys.disabled():
        print(f"RT branch labels: {sum(a == b for a, b in zip(got_b, want_b))}/{len(got_b)} equal "
              f"(true {sum(s is True for _, s in got_b)}, unlabelled {sum(s is None for _, s in got_b)}); "
              f"groups {http_rt['groups']}, run metrics: "
              + ", ".join(f"{k}={v:g}" for k, v in sorted(m_rt.items()) if k.startswith("supervision/judge")))
    assert len(got_b) == 16 and got_b == want_b and all(s is not None for _, s in got_b)
    assert http_rt == local_rt and http_rt["groups"] == 4 and http_rt["labelled"] == 16
    assert m_rt["supervision/judge_labels"] == 16 and m_rt["supervision/judge_calls"] == http_rt["calls"]


def test_judge_killed_mid_run_then_restarted(tw_run, capsys):
    """Wave 1 is labelled; the server is killed while wave 2's requests are in flight (their sub-agents become
    untrainable and are counted); restarted on the same port, wave 3 is labelled. No tree loses a node."""
    waves = [judge_trees(4, seed=s, prefix=f"w{s}-") for s in (1, 2, 3)]
    proc = serve_process([str(tw_run)], *FLAGS)
    port = int(proc.url.rsplit(":", 1)[1])
    model = httpx.get(proc.url + "/v1/models").json()["data"][0]["id"]
    chat = ChatJudge(proc.url + "/v1", model, max_tokens=MAX_TOKENS, timeout_s=30, backoff_s=0.05, **JUDGE)
    judge = SubagentJudge(chat, concurrency=4)   # a few in flight at a time, so the kill lands mid-wave

    async def wave2_with_kill():
        task = asyncio.ensure_future(judge.label_subagents(waves[1]))
        async with httpx.AsyncClient() as h:
            while (await h.get(proc.url + "/metrics")).json()["server"]["in_flight"] == 0:
                await asyncio.sleep(0.01)
        proc.kill()
        return await task

    restarted = None
    try:
        first = asyncio.run(judge.label_subagents(waves[0]))
        second = asyncio.run(wave2_with_kill())
        with pytest.raises(JudgeUnavailable, match="cannot reach"):
            asyncio.run(chat.ensure_reachable())
        restarted = serve_process([str(tw_run)], *FLAGS, port=port)
        third = asyncio.run(judge.label_subagents(waves[2]))
    finally:
        proc.kill()
        if restarted is not None:
            restarted.stop()
    everything = [t for w in waves for t in w]
    m = tree_metrics(everything, env="textworld_sync")
    untrainable = sum(n.skip_gradient_update for t in everything for n in t.nodes.values())
    with capsys.disabled():
        print(f"\nkill-and-restart: wave 1 {first['labelled']}/{first['candidates']} labelled, wave 2 (killed "
              f"mid-wave) {second['labelled']}/{second['candidates']} labelled, {second['failed']} failed, wave 3 "
              f"(restarted) {third['labelled']}/{third['candidates']}; untrainable nodes {untrainable}; "
              f"metrics execution_judge_failures={m['supervision/execution_judge_failures']:g} "
              f"execution_judge_labels={m['supervision/execution_judge_labels']:g}")
    assert first["failed"] == 0 and third["failed"] == 0 and first["labelled"] == third["labelled"] == 12
    assert second["failed"] > 0 and untrainable == second["failed"]
    assert m["supervision/execution_judge_failures"] == second["failed"]
    assert all(len(t.nodes) == 4 for t in everything)            # nothing lost from the trees
    failed = [n.misc[SPENT_KEY]["error"] for t in waves[1] for n in t.nodes.values() if n.skip_gradient_update]
    assert all(str(port) in e for e in failed)


def test_a_hanging_judge_is_bounded_by_its_timeout():
    """A server that accepts the connection and never answers: each attempt ends at the timeout, the label is
    excluded, and the whole label takes about attempts × timeout."""
    srv = socket.create_server(("127.0.0.1", 0))
    held = []
    stop = threading.Event()

    def accept():
        srv.settimeout(0.1)
        while not stop.is_set():
            try:
                held.append(srv.accept()[0])
            except OSError:
                pass

    threading.Thread(target=accept, daemon=True).start()
    try:
        chat = ChatJudge(f"http://127.0.0.1:{srv.getsockname()[1]}/v1", "m", timeout_s=0.5, max_attempts=2,
                         backoff_s=0.05)
        t0 = time.monotonic()
        label = asyncio.run(judge_trees_label(chat))
        took = time.monotonic() - t0
    finally:
        stop.set()
        srv.close()
        for c in held:
            c.close()
    assert label.success is None and label.attempts == 2 and "within 0.5 s" in label.error
    assert 1.0 <= took < 3.0


async def judge_trees_label(chat):
    tree = judge_trees(1, subagents=1)[0]
    return await chat.label(tree.nodes["root/subagent-0-0"], tree.root.goal)
