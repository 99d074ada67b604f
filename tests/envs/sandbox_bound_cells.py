"""Hostile cells against the host's bounds on a cell (issue #55 part 3), run by a host process of their own.

``python tests/envs/sandbox_bound_cells.py [NAME ...]`` runs each named cell (all by default) in an attacker's
TextCraft session while a second session (the peer, another tree) holds a live sandbox, and prints one JSON line per
cell: how long the cell took against its limits, the host's CPU seconds and peak RSS growth while it ran, the
attacker sandbox's own CPU seconds, the host loop's longest stall, the most sandboxes alive at once, how many
sub-agents were launched, why the host failed the cell (``violation``), what the attacker's next cell printed, and
whether the peer's cells (one run meanwhile, one after) kept their limits and namespace. Sub-agents are the
harness's: a "slow" one waits 12 s (a legitimate long sub-agent; ``slow_s`` changes it), a "child" one runs a cell
of its own in a new sandbox of the attacker's tree and closes it when done. A "plain" cell runs in a bare
``Sandbox`` whose one sync tool, ``slow``, is answered by a handler that awaits for 12 s.

It also runs against the host before issue #55 (``tools/bench_hostile_cells.py`` puts that code first on the path):
what the older host lacks (``violation``, the live-sandbox cap, newer ``Limits`` fields) is left out there. Like
``sandbox_attacks.py`` it runs as its own process; ``tests/envs/test_sandbox_bounds.py`` runs it as root and as an
unprivileged user.
"""

from __future__ import annotations

import asyncio
import dataclasses
import itertools
import json
import os
import resource
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from sandbox_attacks import LIMITS, PRE, cpu_seconds, rss_mb

from envs_py import sandbox
from envs_py.sandbox import Limits, Sandbox
from envs_py.textcraft import TextCraftSession, load_tasks

SLOW_SUBAGENT_S = 12.0
# its own timers off: only the host can stop it
OFF = "sig = g['sys'].modules['signal']\nsig.setitimer(sig.ITIMER_PROF, 0)\nsig.setitimer(sig.ITIMER_REAL, 0)\n"
FRAME = ("import json\ndef fr(d):\n    b = json.dumps(d, separators=(',', ':')).encode()\n    return len(b).to_bytes(4, 'little') + b\n")
# name -> (code, options): launch = which sub-agents answer launch_subagent; peer = run a peer cell meanwhile;
# cancel = cancel the attacker's run_cell after this many seconds (a tree timeout).
CELLS = {
    # async-flagged calls of a sync tool (get_info of 3,000 names), one after another with its timers off: the host
    # paused its wall clock while one was in flight
    "async_flag_stream": (PRE + OFF + "sel = g['sys'].modules['select']\nbuf = bytearray()\n"
                          "names = {'l': ['%09d' % k for k in range(3000)]}\nfor i in range(10 ** 6, 10 ** 9):\n"
                          "    send({'t': 'call', 'id': i, 'name': 'get_info', 'a': {'l': [names]}, 'k': {'d': []}, "
                          "'async': True})\n    while len(buf) < 4 or len(buf) < 4 + int.from_bytes(buf[:4], 'little'):"
                          "\n        sel.select([0], [], [])\n        try:\n            buf += g['read'](0, 1 << 20)\n"
                          "        except BlockingIOError:\n            pass\n"
                          "    del buf[:4 + int.from_bytes(buf[:4], 'little')]", {"peer": True}),
    # legitimate async calls (launch_subagent without targets: answered at once with an error), one after another
    # with its timers off: each paused the host's wall clock while in flight
    "legit_async_stream": (PRE + OFF + "for i in range(10 ** 7):\n    await launch_subagent()", {"peer": True}),
    # 200 sub-agents launched at once (3 s each): nothing capped the calls in flight
    "inflight_flood": ("r = await asyncio.gather(*[launch_subagent({'raw_o7': 1}) for _ in range(200)], "
                       "return_exceptions=True)\nprint(sum(isinstance(x, str) for x in r), 'answered,', "
                       "sum(isinstance(x, Exception) for x in r), 'refused')", {"launch": "slow", "slow_s": 3.0}),
    # one legitimate sub-agent of 12 s, awaited: only a capped pause (2 s here) is left uncounted
    "pause_capped_wait": ("r = await launch_subagent({'raw_o7': 1})\nprint(r)",
                          {"launch": "slow", "limits": {"pause_cap_s": 2.0}}),
    # a legitimate sub-agent in flight, and the cell spins meanwhile with its timers off
    "spin_during_subagent": (PRE + OFF + "t = asyncio.create_task(launch_subagent({'raw_o7': 1}))\n"
                             "await asyncio.sleep(0)\nwhile True:\n    pass", {"launch": "slow", "peer": True}),
    # an async tool called as sync (the host awaited it inline) while 24 frames of 1 MiB (333k lists each) arrive
    "inbox_bytes_during_handler": (PRE + FRAME + "send({'t': 'call', 'id': 7, 'name': 'launch_subagent', "
                                   "'a': {'l': [{'d': [['raw_o7', 1]]}]}, 'k': {'d': []}, 'async': False})\n"
                                   "b = fr({'t': 'x', 'p': [[] for _ in range(349000)]})\n"
                                   "for _ in range(24):\n    g['write'](1, b)\nimport time\ntime.sleep(30)",
                                   {"launch": "slow"}),
    # a sync tool whose handler awaits (12 s) while 24 frames of 1 MiB (349k empty lists each) arrive
    "inbox_bytes_sync_await": ("g = [c for c in ().__class__.__base__.__subclasses__() if c.__name__ == "
                               "'_wrap_close'][0].__init__.__globals__\ng['sys'].modules['__main__'].TRUSTED[0] = 1\n"
                               "send = slow.__globals__['send']\n" + FRAME +
                               "send({'t': 'call', 'id': 7, 'name': 'slow', 'a': {'l': []}, 'k': {'d': []}, "
                               "'async': False})\nb = fr({'t': 'x', 'p': [[] for _ in range(349000)]})\n"
                               "for _ in range(24):\n    g['write'](1, b)\nimport time\ntime.sleep(30)",
                               {"plain": True}),
    # this cell's done and, in the same write, a forged done for the next cell: the next observation
    "frame_after_done": (PRE + FRAME + "g['write'](1, fr({'t': 'done', 'n': cell_n, 'out': 'this cell', 'err': '', "
                         "'ok': True}) + fr({'t': 'done', 'n': cell_n + 1, 'out': 'forged next observation', "
                         "'err': '', 'ok': True}))\nimport time\ntime.sleep(30)", {}),
    # a tree timeout cancels run_cell while the cell spins with its timers off
    "cancelled_spin": (PRE + OFF + "while True:\n    pass", {"cancel": 0.5}),
    # a legal get_info of 76,000 names, three times
    "get_info_76000": ("names = ['%09d' % i for i in range(76000)]\nfor _ in range(3):\n"
                       "    r = get_info(names)\nprint(type(r).__name__, len(r))", {}),
    # a legal get_info of 4,000 names (all of a world's ~2,000 and more), three times
    "get_info_4000": ("names = ['%09d' % i for i in range(4000)]\nfor _ in range(3):\n"
                      "    r = get_info(names)\nprint(type(r).__name__, len(r))", {}),
    # 24 sub-agents at once, each a cell in a sandbox of its own
    "subagent_fanout": ("r = await asyncio.gather(*[launch_subagent({'raw_o7': 1}) for _ in range(24)])\n"
                        "print(len(r), r[0])", {"launch": "child"}),
    # the same with at most 6 live sandboxes in this host process: the children wait for a slot, none fails
    "subagent_fanout_capped": ("r = await asyncio.gather(*[launch_subagent({'raw_o7': 1}) for _ in range(24)])\n"
                               "print(len(r), r[0])", {"launch": "child", "max_live": 6}),
}
PEER_CELL = "for _ in range(300):\n    view_inventory()\nprint('peer ok')"


class PlainSession:
    """A bare Sandbox with one sync tool, ``slow``, whose handler awaits for 12 s: the part of a session the
    harness uses."""

    def __init__(self, limits: Limits):
        self.sandboxes = {"root": Sandbox(["slow"], [], limits)}

    async def run_cell(self, agent_id: str, code: str, launch=None) -> dict:
        def handler(name, args, kwargs):
            return asyncio.sleep(SLOW_SUBAGENT_S, "slept")
        return dataclasses.asdict(await self.sandboxes[agent_id].run_cell(code, handler))

    async def close(self) -> None:
        for sb in self.sandboxes.values():
            await sb.close()


def limits_for(opts: dict) -> Limits:
    """Returns the harness's limits with the cell's overrides (those this host's Limits has)."""
    names = {f.name for f in dataclasses.fields(Limits)}
    return dataclasses.replace(LIMITS, **{k: v for k, v in opts.get("limits", {}).items() if k in names})


def host_cpu() -> float:
    """Returns this host process's CPU seconds so far (its own, not its children's)."""
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def live(session: TextCraftSession) -> int:
    """Returns how many of the session's sandboxes have a live process."""
    return sum(1 for sb in list(session.sandboxes.values()) if sb.proc is not None and sb.proc.poll() is None)


async def attack(name: str, task) -> dict:
    code, opts = CELLS[name]
    slots = getattr(sandbox, "SLOTS", None)  # the live-sandbox cap (absent before issue #55)
    cap = slots.cap if slots is not None else None
    if slots is not None and opts.get("max_live"):
        sandbox.set_max_live(opts["max_live"])
    waits0 = slots.waits if slots is not None else 0
    limits = limits_for(opts)
    attacker = PlainSession(limits) if opts.get("plain") else TextCraftSession.from_task(task, limits=limits)
    victim = TextCraftSession.from_task(task, limits=LIMITS)
    await victim.run_cell("root", "v = 7")
    await attacker.run_cell("root", "a = 1")
    apid = attacker.sandboxes["root"].pid
    ids = itertools.count(1)
    launches = [0]

    async def launch(agent_id: str, req: dict) -> str:
        launches[0] += 1
        if opts.get("launch") == "slow":
            await asyncio.sleep(opts.get("slow_s", SLOW_SUBAGENT_S))
            return "child done"
        cid = f"child{next(ids)}"
        attacker.world.add_agent(cid, req["targets"], agent_id)
        r = await attacker.run_cell(cid, "import time\ntime.sleep(0.5)\nprint('child ok')")
        sb = attacker.sandboxes.pop(cid, None)  # its episode is over: its sandbox goes
        if sb is not None:
            await sb.close()
        return r["output"].strip()

    stats = {"gap": 0.0, "rss": 0.0, "cpu": 0.0, "live": 0}
    stop = [False]
    cpu_start = cpu_seconds(apid) or 0.0

    async def heartbeat():  # the host's loop must never stall for long; its RSS and the attacker's CPU sampled
        last = time.monotonic()
        while not stop[0]:
            await asyncio.sleep(0.02)
            now = time.monotonic()
            stats["gap"], last = max(stats["gap"], now - last), now
            stats["rss"] = max(stats["rss"], rss_mb())
            c = cpu_seconds(apid)
            if c is not None:
                stats["cpu"] = c - cpu_start
            stats["live"] = max(stats["live"], live(attacker) + live(victim))

    hb = asyncio.ensure_future(heartbeat())
    rss0, cpu0, t0 = rss_mb(), host_cpu(), time.monotonic()
    run = asyncio.ensure_future(attacker.run_cell("root", code, launch))
    peer_run = asyncio.ensure_future(victim.run_cell("root", PEER_CELL)) if opts.get("peer") else None
    raised, r = None, {}
    try:
        if opts.get("cancel"):
            await asyncio.sleep(opts["cancel"])
            run.cancel()
            try:
                await run
            except asyncio.CancelledError:
                pass
            r = {"output": "", "error": "(cancelled)", "limit": None}
        else:
            r = await asyncio.wait_for(run, 60)
    except asyncio.TimeoutError:
        raised = "the cell ran past the harness's 60 s"
    except Exception as e:  # noqa: BLE001  (the harness reports it: the host must never raise)
        raised = f"{type(e).__name__}: {e}"
    took, host_cpu_s = time.monotonic() - t0, host_cpu() - cpu0
    peer_during = await peer_run if peer_run is not None else None
    await asyncio.sleep(0.2)
    c0 = cpu_seconds(apid)
    await asyncio.sleep(0.5)
    c1 = cpu_seconds(apid)
    stop[0] = True
    await hb
    nxt = await attacker.run_cell("root", "print(6 * 7)")
    peer = await victim.run_cell("root", "v")
    slot_waits = slots.waits - waits0 if slots is not None else None
    if slots is not None:
        sandbox.set_max_live(cap)
    report = {
        "name": name, "took_s": round(took, 2), "limits": {"cpu_s": LIMITS.cpu_s, "wall_s": LIMITS.wall_s,
                                                            "grace_s": LIMITS.grace_s},
        "host_raised": raised, "attacker_output": (r.get("output", "") + r.get("error", ""))[-300:],
        "attacker_limit": r.get("limit"), "violation": r.get("violation"), "launches": launches[0],
        "host_cpu_s": round(host_cpu_s, 2),
        "host_rss_growth_mb": round(stats["rss"] - rss0, 1), "attacker_cpu_s": round(stats["cpu"], 2),
        "attacker_cpu_after_cell_s": None if c0 is None or c1 is None else round(c1 - c0, 2),
        "host_loop_max_gap_s": round(stats["gap"], 2), "live_sandboxes_max": stats["live"],
        "slot_waits": slot_waits,
        "attacker_next_output": nxt["output"] + nxt["error"][:200],
        "peer_during": None if peer_during is None else {k: peer_during[k] for k in ("output", "limit", "ok")},
        "peer_intact": peer["output"] == "7\n" and not peer["restarted"],
    }
    await attacker.close()
    await victim.close()
    return report


def main() -> None:
    task = load_tasks("val")[0]
    for name in sys.argv[1:] or list(CELLS):
        print(json.dumps(asyncio.run(attack(name, task))), flush=True)


if __name__ == "__main__":
    main()
