"""The host bounds every cell (issue #55 part 3), as this user (root in CI) and as an unprivileged one.

The hostile cells of tests/envs/sandbox_bound_cells.py run in a host process of their own (once per mode, shared by
the tests below), each beside a peer session whose cells must keep passing. Each test is one class of the issue: the
cell shape, then what contains it, asserted in wall time, host CPU seconds, host RSS growth and the peer's cells.
The classes that depend on the kernel layers (reading the sandbox's CPU from /proc, killing it, its frames) also run
as an unprivileged user; the rest is host logic, the same for both. The unit tests at the end check the pieces.
"""

import asyncio
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from envs_py.sandbox import Limits, Sandbox
from envs_py.sandbox_budget import CellBudget, process_cpu
from envs_py.sandbox_protocol import MAX_INBOX_BYTES, FrameReader, Inbox, Violation, decode_frame
from envs_py.sandbox_slots import LiveSlots

sys.path.insert(0, str(Path(__file__).parent))
from test_sandbox_boundary import _unprivileged

ROOT = Path(__file__).resolve().parents[2]
HARNESS = Path(__file__).parent / "sandbox_bound_cells.py"
ALL = ["async_flag_stream", "legit_async_stream", "inflight_flood", "pause_capped_wait", "spin_during_subagent",
       "inbox_bytes_during_handler", "inbox_bytes_sync_await", "frame_after_done", "cancelled_spin",
       "get_info_76000", "get_info_4000", "subagent_fanout_capped"]
UNPRIVILEGED = ["async_flag_stream", "legit_async_stream", "spin_during_subagent", "inbox_bytes_sync_await",
                "frame_after_done", "cancelled_spin"]
# cpu_s 1 + grace 1: the host's CPU budget; wall_s 2 + grace 1: its wall budget (tests/envs/sandbox_attacks.py)
CPU_BUDGET, WALL_BUDGET = 2.0, 3.0
_REPORTS: dict[str, dict] = {}


def reports(mode: str) -> dict:
    """Returns the harness's report per cell for ``mode``, running it once per mode."""
    if mode not in _REPORTS:
        names = ALL if mode == "this-user" else UNPRIVILEGED
        p = subprocess.run([sys.executable, str(HARNESS), *names], cwd=ROOT, start_new_session=True,
                           preexec_fn=_unprivileged if mode == "unprivileged" else None, capture_output=True,
                           text=True, timeout=240, env={**os.environ, "PYTHONPATH": str(ROOT)})
        got = {r["name"]: r for r in map(json.loads, p.stdout.splitlines())}
        assert list(got) == names, (p.returncode, p.stderr[-3000:])
        _REPORTS[mode] = got
    return _REPORTS[mode]


def contained(r: dict, took_s: float, host_cpu_s: float = 1.0, rss_mb: float = 50.0) -> None:
    """Asserts a cell was contained: the host never raised nor stalled, it took under ``took_s`` and the host under
    ``host_cpu_s`` CPU seconds and ``rss_mb`` of RSS growth, the attacker's next cell ran, and the peer's cells
    (one during, where the cell has one, and one after, in its own namespace) passed."""
    assert r["host_raised"] is None, r
    assert r["took_s"] < took_s and r["host_cpu_s"] < host_cpu_s and r["host_rss_growth_mb"] < rss_mb, r
    assert r["host_loop_max_gap_s"] < 0.5, r
    assert r["attacker_next_output"] == "42\n", r
    assert r["peer_intact"], r
    if r["peer_during"] is not None:
        assert r["peer_during"] == {"output": "peer ok\n", "limit": None, "ok": True}, r


def failed_for(r: dict, kind: str) -> None:
    """Asserts the host failed the cell for ``kind``, killed its sandbox, and the observation says why."""
    assert r["violation"] == kind and r["attacker_limit"] == "killed", r
    assert "Variables from earlier cells were lost" in r["attacker_output"], r


MODES = ["this-user", "unprivileged"]


@pytest.mark.slow
@pytest.mark.parametrize("mode", MODES)
def test_async_flag_of_a_sync_tool_is_a_violation(mode):
    # get_info frames flagged async, streamed with the cell's timers off: before, 12.4 s and 9.4 host CPU-s
    r = reports(mode)["async_flag_stream"]
    failed_for(r, "protocol")
    assert "async flag is not its tool's" in r["attacker_output"]
    contained(r, took_s=1.0, host_cpu_s=0.2)


@pytest.mark.slow
@pytest.mark.parametrize("mode", MODES)
def test_legit_async_stream_meets_the_host_cpu_budget(mode):
    # launch_subagent() answered at once, awaited in a loop with the cell's timers off: before, 8 s of wall clock
    r = reports(mode)["legit_async_stream"]
    assert r["violation"] in ("cpu", "wall"), r
    failed_for(r, r["violation"])
    assert r["attacker_cpu_s"] <= CPU_BUDGET + 0.4, r
    contained(r, took_s=WALL_BUDGET + 3.0, host_cpu_s=CPU_BUDGET + 1.0)


@pytest.mark.slow
@pytest.mark.parametrize("mode", MODES)
def test_spinning_while_a_subagent_runs_meets_the_host_cpu_budget(mode):
    # a 12 s sub-agent in flight (the wall clock rightly paused) while the cell spins with its timers off:
    # before, 12 CPU-s of the sandbox's against a 1 s limit
    r = reports(mode)["spin_during_subagent"]
    failed_for(r, "cpu")
    assert "CPU time limit" in r["attacker_output"]
    assert r["attacker_cpu_s"] <= CPU_BUDGET + 0.4 and r["attacker_cpu_after_cell_s"] in (None, 0.0), r
    contained(r, took_s=8.0, host_cpu_s=0.5)


def test_calls_in_flight_are_capped():
    # 200 sub-agents of 3 s launched at once: before, all 200 ran
    r = reports("this-user")["inflight_flood"]
    assert r["launches"] == Limits().max_inflight, r
    assert "32 answered, 168 refused" in r["attacker_output"], r
    contained(r, took_s=6.0)


def test_the_pause_for_subagents_is_capped():
    # one legitimate 12 s sub-agent with a pause cap of 2 s: killed at the cap + the wall budget, not at 12 s
    r = reports("this-user")["pause_capped_wait"]
    failed_for(r, "wall")
    assert 2.0 + WALL_BUDGET - 0.3 < r["took_s"] < 2.0 + WALL_BUDGET + 1.5, r
    contained(r, took_s=7.0)


@pytest.mark.slow
@pytest.mark.parametrize("mode", MODES)
def test_frames_piling_up_cost_their_bytes_not_the_host(mode):
    # 24 frames of 1 MiB (349k empty lists each) while the host awaits a sync tool's handler: before, +478 MB RSS
    for name in (["inbox_bytes_during_handler"] if mode == "this-user" else []) + ["inbox_bytes_sync_await"]:
        r = reports(mode)[name]
        failed_for(r, "protocol")
        contained(r, took_s=2.0, rss_mb=30.0)


@pytest.mark.slow
@pytest.mark.parametrize("mode", MODES)
def test_a_frame_after_done_fails_the_cell_not_the_next_one(mode):
    # this cell's done and a forged done of the next cell in one write: before, the next cell's observation
    r = reports(mode)["frame_after_done"]
    failed_for(r, "protocol")
    assert "a frame after the cell's done" in r["attacker_output"]
    contained(r, took_s=1.0)  # the next cell printed 42 in a fresh namespace, not the forged text


@pytest.mark.slow
@pytest.mark.parametrize("mode", MODES)
def test_a_cancelled_cell_stops_its_sandbox(mode):
    # a tree timeout cancels run_cell while the cell spins with its timers off: before, it spun on (0.68 CPU-s per
    # second) and the next cell was killed for the wall clock it had used
    r = reports(mode)["cancelled_spin"]
    assert r["attacker_cpu_after_cell_s"] in (None, 0.0), r  # the process is gone (or a zombie)
    contained(r, took_s=1.0)


def test_large_tool_calls_are_bounded_off_the_loop():
    # get_info of 76,000 names three times: before, 0.25 s loop stalls and +41 MB RSS; now refused at 4,096 entries
    r = reports("this-user")["get_info_76000"]
    assert "more than 4096 entries" in r["attacker_output"] and r["violation"] is None, r
    contained(r, took_s=1.0, rss_mb=10.0)
    assert r["host_loop_max_gap_s"] < 0.15, r
    ok = reports("this-user")["get_info_4000"]  # a legal large call is answered
    assert ok["attacker_output"] == "list 4000\n" and ok["host_loop_max_gap_s"] < 0.15, ok
    contained(ok, took_s=2.0)


def test_live_sandboxes_are_capped_with_back_pressure():
    # 24 sub-agents at once, each a cell in its own sandbox, with at most 6 live sandboxes: they wait, none fails
    r = reports("this-user")["subagent_fanout_capped"]
    assert r["attacker_output"] == "24 child ok\n" and r["attacker_limit"] is None, r
    assert r["live_sandboxes_max"] <= 6 and r["slot_waits"] > 0, r
    contained(r, took_s=10.0)


# -- the pieces ---------------------------------------------------------------------------------------------------
def test_inbox_holds_undecoded_frames_bounded_in_bytes():
    inbox, violations = Inbox(), []
    reader = FrameReader(inbox, lambda: True, lambda: violations.append(1))
    body = json.dumps({"t": "x", "p": [[] for _ in range(349000)]}, separators=(",", ":")).encode()
    frame = len(body).to_bytes(4, "little") + body
    for _ in range(24):
        reader.data_received(frame)
    kept = [x for x in inbox.items if type(x) is bytes]
    assert len(kept) == MAX_INBOX_BYTES // len(frame) and inbox.size <= MAX_INBOX_BYTES, inbox.size
    assert violations == [1] and isinstance(inbox.items[-1], Violation) and reader.broken
    assert decode_frame(kept[0])["t"] == "x"
    with pytest.raises(ValueError):
        decode_frame(b"[1]")
    assert inbox.clear() == len(kept) and inbox.frames == inbox.size == 0


def test_cell_budget_pauses_only_up_to_its_cap():
    b = CellBudget(wall_s=3.0, cpu_s=2.0, pause_cap_s=2.0, pid=None, start=0.0)
    b.pause(1.0)
    assert b.wall_used(3.0) == 1.0  # 2 s paused: uncounted
    assert b.wall_used(4.0) == 2.0 and b.check(4.0)[0] is None  # 3 s paused, of which the cap, 2, is uncounted
    assert b.check(5.0)[0] == "wall"
    b = CellBudget(wall_s=3.0, cpu_s=2.0, pause_cap_s=10.0, pid=None, start=0.0)
    b.pause(1.0)
    b.resume(2.0)
    assert b.wall_used(3.0) == 2.0
    b.charge(2.5)  # the host's own service time counts
    assert b.check(3.0)[0] == "cpu"
    assert process_cpu(os.getpid()) > 0 and process_cpu(None) is None


def test_live_slots_wait_and_pass_on_a_cancelled_wait():
    async def main():
        slots = LiveSlots(1)
        await slots.acquire()
        waiting = asyncio.ensure_future(slots.acquire())
        second = asyncio.ensure_future(slots.acquire())
        await asyncio.sleep(0.01)
        assert not waiting.done() and slots.waits == 2
        waiting.cancel()
        await asyncio.sleep(0)
        slots.release()  # to the next live waiter
        await asyncio.wait_for(second, 1)
        slots.release()
        return slots.live

    assert asyncio.new_event_loop().run_until_complete(main()) == 0


def _ended(pid: int) -> bool:
    """Returns whether process ``pid`` has ended (gone, or a zombie) within 1 s."""
    deadline = time.monotonic() + 1.0
    while time.monotonic() < deadline:
        try:
            if open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()[0] in ("Z", "X"):
                return True
        except OSError:
            return True
        time.sleep(0.01)
    return False


def test_cancelled_run_cell_kills_its_sandbox_and_replies_are_bounded():
    async def main():
        sb = Sandbox(["big", "echo"], [], Limits(cpu_s=1, wall_s=2, grace_s=1))
        handler = (lambda name, args, kwargs: "x" * (5 << 20) if name == "big" else len(args[0]))
        r = await sb.run_cell("try:\n    big()\nexcept RuntimeError as e:\n    print(str(e)[:23])\n"
                              "print(echo(list(range(4000))))", handler)
        task = asyncio.ensure_future(sb.run_cell("while True:\n    pass", handler))
        await asyncio.sleep(0.3)
        pid = sb.pid
        task.cancel()
        t0 = time.monotonic()
        with pytest.raises(asyncio.CancelledError):
            await task
        gone = sb.proc is None and _ended(pid)
        again = await sb.run_cell("print(1)", handler)
        await sb.close()
        return r, gone, time.monotonic() - t0, again

    r, gone, took, again = asyncio.new_event_loop().run_until_complete(main())
    assert r.output == "tool result too large (\n4000\n", r
    assert gone and took < 1.0
    assert again.output == "1\n" and again.restarted
