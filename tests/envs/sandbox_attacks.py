"""Hostile cells against the sandbox boundary (issue #49), run by a host process of their own.

``python tests/envs/sandbox_attacks.py [NAME ...]`` runs each named cell (all but the orphan one by default) in an
attacker's sandbox while a second session (the victim, another tree) holds a live sandbox, and prints one JSON line
per cell: whether the peer's next cell and namespace, the peer's scheduling, the host, both worlds and the user's
files are intact, and what the cell printed (which names the layer that stopped it). ``--no-seccomp`` runs them
without the seccomp allowlist (the namespaces and the protocol alone). ``--orphan`` starts two sandboxes, lets one try to outlive its host, prints their pids and waits to be SIGKILLed.

It runs as its own process so that a cell which signals the host's process group, or kills the host, takes down
this harness and not pytest; tests/envs/test_sandbox_boundary.py runs it as root and as an unprivileged user.
"""

from __future__ import annotations

import asyncio
import json
import os
import socket
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

from envs_py.sandbox import Limits
from envs_py.textcraft import TextCraftSession, load_tasks

LIMITS = Limits(cpu_s=1.0, wall_s=2.0, grace_s=1.0, memory_mb=512, output_chars=4000)
# The audit hook switched off and libc in hand: what a determined cell has (the in-process layers do not count).
PRE = ("g = [c for c in ().__class__.__base__.__subclasses__() if c.__name__ == '_wrap_close'][0]"
       ".__init__.__globals__\n"
       "g['sys'].modules['__main__'].TRUSTED[0] = 1\n"
       "C = g['sys'].modules['ctypes'].CDLL(None, use_errno=True)\n"
       "send = view_inventory.__globals__['send']\n"
       "ct_errno = g['sys'].modules['ctypes'].get_errno\n"
       "cell_n = int(g['sys']._getframe(0).f_code.co_filename[6:-1])\n")
# fcntl: F_GETFL 3, F_SETFL 4, F_SETOWN 8, F_SETSIG 10; O_ASYNC 0o20000. The signal fires when the host writes the
# attacker's next tool reply.
ASYNC_OWNER = PRE + "r = [C.fcntl(0, 4, C.fcntl(0, 3) | 0o20000), C.fcntl(0, 8, {owner}), C.fcntl(0, 10, {sig})]\n" \
    "view_inventory()\nview_inventory()\nprint('armed', r, 'errno', C.__class__.__module__ and ct_errno())"
CELLS = {
    "peer": {
        "fcntl_sigkill_peer": ASYNC_OWNER.replace("{owner}", "{victim}").replace("{sig}", "9"),
        "fcntl_sigalrm_process_group": ASYNC_OWNER.replace("{owner}", "-{pgid}").replace("{sig}", "14"),
        "fcntl_sigkill_host": ASYNC_OWNER.replace("{owner}", "{host}").replace("{sig}", "9"),
        "kill_peer": PRE + "g['kill']({victim}, 19)",
        "ptrace_peer": PRE + "print(C.ptrace(16, {victim}, 0, 0), ct_errno())",  # PTRACE_ATTACH
        "sched_idle_peer": PRE + "g['sched_setscheduler']({victim}, 5, g['sched_param'](0))",
        "renice_peer": PRE + "g['setpriority'](0, {victim}, 19)",
        "affinity_peer": PRE + "g['sched_setaffinity']({victim}, {{0}})",
    },
    "limits": {
        "forged_done_then_spin": PRE + "sig = g['sys'].modules['signal']\nsig.setitimer(sig.ITIMER_PROF, 0)\n"
                                       "sig.setitimer(sig.ITIMER_REAL, 0)\n"
                                       "send({{'t': 'done', 'n': cell_n, 'out': 'forged', 'err': '', 'ok': True}})\n"
                                       "while True:\n    pass",
        "inbox_flood": PRE + "import json\nb = json.dumps({{'t': 'call', 'id': 1, 'name': 'view_inventory', "
                             "'a': {{'l': ['x' * 60000]}}, 'k': {{'d': []}}, 'async': False}}).encode()\n"
                             "b = len(b).to_bytes(4, 'little') + b\nwhile True:\n    g['write'](1, b)",
    },
    "decode": {
        "call_id_list": PRE + "send({{'t': 'call', 'id': [1], 'name': 'launch_subagent', 'a': {{'l': []}}, "
                              "'k': {{'d': []}}, 'async': True}})\nimport time\ntime.sleep(1.5)",
        "colliding_int_keys": PRE + "P = 2 ** 61 - 1\nsend({{'t': 'call', 'id': 5, 'name': 'view_inventory', "
                                    "'a': {{'l': [{{'d': [[k * P, 0] for k in range(1, 30000)]}}]}}, "
                                    "'k': {{'d': []}}, 'async': False}})\nimport time\ntime.sleep(1.5)",
        "frame_not_an_object": PRE + "send([1, 2, 3])\nview_inventory()",
        "done_with_wrong_types": PRE + "send({{'t': 'done', 'n': cell_n, 'out': {{'d': 1}}, 'err': [1], "
                                       "'ok': 'yes', 'limit': [2]}})\nimport time\ntime.sleep(1.5)",
    },
    "network": {  # the trainer's judge server listens on loopback: a cell must not reach it
        "connect_host_loopback": PRE + "s = g['sys'].modules['socket'].socket()\ns.settimeout(1)\n"
                                       "s.connect(('127.0.0.1', {port}))\nprint('connected')",
        # the same after freeing a descriptor (its own event loop's), so the NOFILE limit is not what stops it
        "connect_host_loopback_fd_freed": PRE + "for fd in (5, 4, 3):\n    try:\n        g['close'](fd)\n"
                                                "        break\n    except OSError:\n        pass\n"
                                                "s = g['sys'].modules['socket'].socket()\ns.settimeout(1)\n"
                                                "s.connect(('127.0.0.1', {port}))\nprint('connected')",
    },
    "files": {
        "fchmodat2_file_0777": PRE + "print(C.syscall(452, -100, b'{file}', 0o777, 0), ct_errno())",
        "fchmodat2_dir_0000": PRE + "print(C.syscall(452, -100, b'{subdir}', 0, 0), ct_errno())",
        "utime_file": PRE + "g['utime']('{file}', (0, 0))",
        "setxattr_file": PRE + "g['setxattr']('{file}', 'user.pwned', b'1')",
        "rmdir": PRE + "g['rmdir']('{empty}')",
        "proc_host_cwd": PRE + "print(g['readlink']('/proc/{host}/cwd'))",
    },
}
# Outlive the host: no parent-death signal (PR_SET_PDEATHSIG 0), its own session, a forged "done", no timers, and
# never read the pipe again (a sandbox blocked on it would see the host's end close).
ORPHAN = PRE + ("sig = g['sys'].modules['signal']\nr = [C.prctl(1, 0, 0, 0, 0)]\ntry:\n    g['setsid']()\n"
                "except OSError as e:\n    r.append(repr(e))\nsig.setitimer(sig.ITIMER_PROF, 0)\n"
                "sig.setitimer(sig.ITIMER_REAL, 0)\n"
                "send({'t': 'done', 'n': cell_n, 'out': str(r), 'err': '', 'ok': True})\nwhile True:\n    pass")


def cpu_seconds(pid: int) -> float | None:
    """Returns process ``pid``'s CPU seconds so far (None once it is gone)."""
    try:
        fields = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def rss_mb() -> float:
    """Returns this process's resident memory in MB."""
    for line in open("/proc/self/status"):
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


def sched(pid: int) -> tuple | None:
    """Returns (policy, nice, affinity) of ``pid`` (None once it is gone)."""
    try:
        return os.sched_getscheduler(pid), os.getpriority(os.PRIO_PROCESS, pid), sorted(os.sched_getaffinity(pid))
    except OSError:
        return None


def files(d: str) -> dict:
    """Returns what a cell must not change in the user's directory ``d``."""
    out = {}
    for name in ("f", "sub", "empty"):
        p = os.path.join(d, name)
        try:
            st = os.stat(p)
            out[name] = [oct(st.st_mode), st.st_mtime_ns, sorted(os.listxattr(p))]
        except OSError as e:
            out[name] = repr(e)
    return out


async def attack(cls: str, name: str, task, d: str) -> dict:
    """Runs one hostile cell with a live peer; returns what it changed."""
    attacker = TextCraftSession.from_task(task, limits=LIMITS)
    victim = TextCraftSession.from_task(task, limits=LIMITS)
    await victim.run_cell("root", "v = 7")
    await attacker.run_cell("root", "a = 1")
    vpid, apid = victim.sandboxes["root"].pid, attacker.sandboxes["root"].pid
    digests, peer_sched, host_sched, user_files = (
        (attacker.digest(), victim.digest()), sched(vpid), sched(os.getpid()), files(d))
    listener = socket.create_server(("127.0.0.1", 0))
    listener.setblocking(False)
    code = CELLS[cls][name].format(victim=vpid, host=os.getpid(), pgid=os.getpgid(0), file=f"{d}/f",
                                   subdir=f"{d}/sub", empty=f"{d}/empty", port=listener.getsockname()[1])
    gaps, stop = [0.0], [False]

    async def heartbeat():  # the host's event loop must never stall for long
        last = time.monotonic()
        while not stop[0]:
            await asyncio.sleep(0.02)
            now = time.monotonic()
            gaps[0], last = max(gaps[0], now - last), now

    hb = asyncio.ensure_future(heartbeat())
    rss0, t0 = rss_mb(), time.monotonic()
    try:
        r = await attacker.run_cell("root", code)
        raised = None
    except Exception as e:  # noqa: BLE001  (the harness reports it: the host must never raise)
        r, raised = {}, f"{type(e).__name__}: {e}"
    took, rss_growth = time.monotonic() - t0, rss_mb() - rss0
    await asyncio.sleep(0.3)  # let signals land
    cpu0 = cpu_seconds(apid)
    await asyncio.sleep(1.0 if cls == "limits" else 0.0)
    cpu1 = cpu_seconds(apid)
    stop[0] = True
    await hb
    peer = await victim.run_cell("root", "v")
    try:
        listener.accept()[0].close()
        reached = True
    except BlockingIOError:
        reached = False
    listener.close()
    report = {
        "class": cls, "name": name, "took_s": round(took, 2), "host_raised": raised,
        "attacker_output": (r.get("output", "") + r.get("error", ""))[-300:], "attacker_limit": r.get("limit"),
        "peer_intact": peer["output"] == "7\n" and not peer["restarted"],
        "peer_sched_intact": sched(vpid) == peer_sched,
        "host_sched_intact": sched(os.getpid()) == host_sched,
        "worlds_intact": (attacker.digest(), victim.digest()) == digests,
        "files_intact": files(d) == user_files,
        "host_reached_on_loopback": reached,
        "host_cwd_leaked": os.path.basename(os.getcwd()) in (r.get("output", "") + r.get("error", "")),
        "host_loop_max_gap_s": round(gaps[0], 2), "host_rss_growth_mb": round(rss_growth, 1),
        "attacker_cpu_between_cells_s": None if cpu0 is None or cpu1 is None else round(cpu1 - cpu0, 2),
    }
    report["contained"] = bool(
        raised is None and report["peer_intact"] and report["peer_sched_intact"] and report["host_sched_intact"]
        and report["worlds_intact"] and report["files_intact"] and not report["host_cwd_leaked"] and not reached
        and gaps[0] < 1.0 and rss_growth < 200 and (report["attacker_cpu_between_cells_s"] or 0) < 0.2)
    await attacker.close()
    await victim.close()
    return report


def user_dir() -> str:
    """Returns a fresh directory of the host's user: a file (0644), a subdirectory (0755) and an empty one."""
    d = tempfile.mkdtemp(prefix="sera_user_files_")
    os.chmod(d, 0o755)
    with open(os.path.join(d, "f"), "w") as f:
        f.write("mine\n")
    os.chmod(os.path.join(d, "f"), 0o644)
    os.mkdir(os.path.join(d, "sub"), 0o755)
    os.mkdir(os.path.join(d, "empty"), 0o755)
    return d


async def orphan(task) -> None:
    """Starts two sessions' sandboxes, one of which tries to outlive the host; prints their pids, then waits."""
    a = TextCraftSession.from_task(task, limits=LIMITS)
    b = TextCraftSession.from_task(task, limits=LIMITS)
    r = await a.run_cell("root", ORPHAN)
    await b.run_cell("root", "v = 7")
    print(json.dumps({"pids": [a.sandboxes["root"].pid, b.sandboxes["root"].pid],
                      "attacker_output": r["output"] + r["error"]}), flush=True)
    await asyncio.sleep(600)


def main() -> None:
    task = load_tasks("val")[0]
    if sys.argv[1:] == ["--orphan"]:
        asyncio.run(orphan(task))
        return
    args = sys.argv[1:]
    if args[:1] == ["--no-seccomp"]:  # the namespaces alone (no pyseccomp for the sandbox, the opt-out set)
        import envs_py.sandbox_process as sp

        sp.seccomp_lib = lambda: ""
        os.environ["SERA_SANDBOX_UNISOLATED"] = "1"
        args = args[1:]
    names = args or [n for cells in CELLS.values() for n in cells]
    d = user_dir()
    cwd = tempfile.mkdtemp(prefix="host_cwd_", dir=d)
    os.chdir(cwd)  # the host's working directory: a cell must not learn its name
    for name in names:
        cls = next(c for c, cells in CELLS.items() if name in cells)
        print(json.dumps(asyncio.run(attack(cls, name, task, d))), flush=True)


if __name__ == "__main__":
    main()
