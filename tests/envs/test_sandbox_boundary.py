"""The sandbox as a kernel-enforced boundary (issue #49), as this user (root in CI) and as an unprivileged one.

The hostile cells of tests/envs/sandbox_attacks.py run in a host process of their own, each with a second live
session: the peer's next cell and namespace, its scheduling, the host, both worlds and the user's files must be
intact. An unprivileged host is this process's user seen through a user namespace (uid 1000 inside, no capability
outside it; files of its own user stay writable to it, as an ordinary user's are), since the interpreter may lie
where uid 65534 cannot read it.
"""

import asyncio
import ctypes
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from envs_py.sandbox import Limits, Sandbox, layer_report
from envs_py.sandbox_protocol import MAX_ENTRIES, check_frame, decode_value

sys.path.insert(0, str(Path(__file__).parent))
from sandbox_attacks import CELLS

ROOT = Path(__file__).resolve().parents[2]
HARNESS = Path(__file__).parent / "sandbox_attacks.py"
LIMITS = Limits(cpu_s=1.0, wall_s=2.0, grace_s=1.0, memory_mb=512, output_chars=4000)
MODES = ["this-user", "unprivileged"]


def _unprivileged() -> None:
    """preexec_fn: this process becomes uid/gid 1000 of a new user namespace, without capabilities outside it."""
    libc = ctypes.CDLL(None, use_errno=True)
    uid, gid = os.geteuid(), os.getegid()
    if libc.unshare(0x10000000) != 0:  # CLONE_NEWUSER
        raise OSError(ctypes.get_errno(), "unshare(CLONE_NEWUSER)")
    for path, text in (("setgroups", "deny"), ("uid_map", f"1000 {uid} 1"), ("gid_map", f"1000 {gid} 1")):
        with open(f"/proc/self/{path}", "w") as f:
            f.write(text)


def _host(args: list[str], mode: str, **kw) -> subprocess.Popen:
    """Returns the harness started as a host in its own session (a cell that signals its process group must not
    reach pytest), unprivileged if ``mode`` says so."""
    return subprocess.Popen([sys.executable, str(HARNESS), *args], cwd=ROOT, start_new_session=True,
                            preexec_fn=_unprivileged if mode == "unprivileged" else None,
                            env={**os.environ, "PYTHONPATH": str(ROOT)}, **kw)


@pytest.mark.slow
@pytest.mark.parametrize("mode", MODES)
def test_hostile_cells_are_contained_with_a_live_peer(mode):
    names = [n for cells in CELLS.values() for n in cells]
    p = _host(names, mode, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    out, err = p.communicate(timeout=300)
    reports = [json.loads(line) for line in out.splitlines()]
    # a host killed by a cell prints no more reports
    assert [r["name"] for r in reports] == names, (p.returncode, err[-2000:])
    escaped = [r for r in reports if not r["contained"]]
    assert not escaped, escaped
    assert "sera sandbox layers: uid 65534" in err  # the host printed its layer report once
    for r in reports:
        if r["class"] in ("peer", "files", "network"):  # every such call is refused by the seccomp allowlist
            out = r["attacker_output"]  # a Python error, or libc's -1 and then errno 1 (EPERM)
            assert "Operation not permitted" in out or ("-1" in out and out.endswith(" 1\n")), r
        if r["class"] == "decode":  # the host answered at once, with the sandbox killed or a bad-call error
            assert r["took_s"] < 3.5 and r["host_loop_max_gap_s"] < 1.0, r


@pytest.mark.slow
@pytest.mark.parametrize("mode", MODES)
def test_the_namespaces_alone_contain_them(mode):
    """Without the seccomp allowlist (opted out), each cell must meet a namespace: no such process, no such file,
    no network; the protocol cells meet the host's checks as before."""
    names = [n for cls, cells in CELLS.items() if cls != "limits" for n in cells]
    p = _host(["--no-seccomp", *names], mode, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    out, err = p.communicate(timeout=300)
    reports = [json.loads(line) for line in out.splitlines()]
    assert [r["name"] for r in reports] == names, (p.returncode, err[-2000:])
    assert not [r for r in reports if not r["contained"]]
    assert "WITHOUT ISOLATION" in err and "seccomp: none" in err and "namespaces: " in err
    for r in reports:
        out = r["attacker_output"]
        if r["class"] == "peer":  # the peer's pid names nothing here (fcntl: F_SETOWN fails, errno 3)
            assert "No such process" in out or "errno 3" in out or out.endswith(" 3\n"), r
        if r["class"] == "files":  # the user's paths and /proc do not exist in the empty root
            assert "No such file or directory" in out or out.endswith(" 2\n"), r
        if r["class"] == "network":
            assert "Network is unreachable" in out or "Too many open files" in out, r


@pytest.mark.parametrize("mode", MODES)
def test_no_sandbox_outlives_a_killed_host(mode):
    p = _host(["--orphan"], mode, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    try:
        started = json.loads(p.stdout.readline())
        assert "Operation not permitted" in started["attacker_output"]  # no prctl, no setsid
        pids = started["pids"]
        assert all(os.path.exists(f"/proc/{pid}") for pid in pids)
    finally:
        p.kill()
        p.wait()
    deadline, alive = time.monotonic() + 5, pids
    while alive and time.monotonic() < deadline:
        time.sleep(0.05)
        alive = [pid for pid in pids if os.path.exists(f"/proc/{pid}")
                 and open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()[0] != "Z"]
    for pid in alive:
        os.kill(pid, signal.SIGKILL)
    assert not alive


def _run(coro):
    return asyncio.new_event_loop().run_until_complete(coro)


def _state(pid: int) -> str:
    """Returns the process's state letter once it is stopped ("T"), or whatever it is after 1 s (a SIGSTOP lands
    when the process is next scheduled)."""
    deadline = time.monotonic() + 1.0
    while True:
        state = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()[0]
        if state == "T" or time.monotonic() > deadline:
            return state
        time.sleep(0.005)


def test_layers_reported_stopped_between_cells_and_killed_for_a_frame_then():
    async def main():
        sb = Sandbox(["tool"], [], LIMITS)
        info = await sb.start()
        idle = _state(sb.pid)
        a = await sb.run_cell("x = 1\nx", lambda *a: None)
        between = _state(sb.pid)
        # forge this cell's done frame, then write once more: that frame arrives while no cell runs
        forged = await sb.run_cell(
            "g = [c for c in ().__class__.__base__.__subclasses__() if c.__name__ == '_wrap_close'][0]"
            ".__init__.__globals__\ng['sys'].modules['__main__'].TRUSTED[0] = 1\nsend = tool.__globals__['send']\n"
            "send({'t': 'done', 'n': 2, 'out': 'forged', 'err': '', 'ok': True})\nimport time\ntime.sleep(0.2)\n"
            "send({'t': 'done', 'n': 2, 'out': 'late', 'err': '', 'ok': True})", lambda *a: None)
        pid = sb.pid
        await asyncio.sleep(0.5)  # stopped after the forged frame: nothing more arrives
        still = sb.proc is not None and _state(pid)
        sb.proc.cont()  # let it write its late frame now: the host kills it at once
        await asyncio.sleep(0.5)
        killed = sb.proc is None
        after = await sb.run_cell("x", lambda *a: None)
        await sb.close()
        return info, idle, a, between, forged, still, killed, after

    info, idle, a, between, forged, still, killed, after = _run(main())
    lay = info["layers"]
    assert set(lay["namespaces"]) == {"pid", "net", "mount", "ipc", "uts"} | ({"user"} if os.getuid() else set())
    assert lay["uid"] == 65534 and lay["capabilities"] == "none" and lay["seccomp"] == "allowlist (libseccomp)"
    assert lay["root"].startswith("empty read-only tmpfs") and lay["rlimits"]["NPROC"] == 0
    assert "namespaces: " in layer_report(info) and "seccomp: allowlist" in layer_report(info)
    assert idle == "T" and between == "T" and a.output == "1\n"  # stopped whenever no cell runs
    assert forged.output == "forged" and still == "T" and killed
    assert after.restarted and "NameError" in after.output


_REFUSAL = """
import asyncio, sys
sys.path.insert(0, sys.argv[1])
import pyseccomp
from envs_py.sandbox import Sandbox, SandboxRefused, Limits
if sys.argv[2] == "no-namespaces":  # what a kernel without user namespaces answers: unshare fails with EPERM
    f = pyseccomp.SyscallFilter(pyseccomp.ALLOW)
    f.add_rule(pyseccomp.ERRNO(1), "unshare")
    f.load()
else:  # pyseccomp not found by the sandbox
    import envs_py.sandbox_process as sp
    sp.seccomp_lib = lambda: ""
async def main():
    sb = Sandbox([], [], Limits(cpu_s=1, wall_s=2, grace_s=1), zygote=sys.argv[3] == "zygote")
    try:
        await sb.start()
    except SandboxRefused as e:
        print("REFUSED", e)
        return
    r = await sb.run_cell("print(6 * 7)", lambda *a: None)
    print("RAN", r.output.strip(), sb.info["layers"]["namespaces"], sb.info["seccomp"])
    await sb.close()
asyncio.run(main())
"""


@pytest.mark.parametrize("zygote", ["zygote", "own"])
@pytest.mark.parametrize("missing", ["no-namespaces", "no-seccomp"])
def test_refused_where_isolation_is_impossible_and_opt_out_warns(missing, zygote):
    def run(opt_out: bool) -> subprocess.CompletedProcess:
        env = {**os.environ, "PYTHONPATH": str(ROOT), "SERA_SANDBOX_UNISOLATED": "1" if opt_out else "0"}
        return subprocess.run([sys.executable, "-c", _REFUSAL, str(ROOT), missing, zygote], capture_output=True,
                              text=True, timeout=120, env=env, preexec_fn=_unprivileged)

    refused, opted_out = run(False), run(True)
    if missing == "no-namespaces":
        assert "REFUSED the sandbox refuses to run model-written code here: no namespaces: unshare(user, pid, net, " \
               "mount, ipc, uts) failed: Operation not permitted" in refused.stdout, refused.stderr[-2000:]
        assert "unprivileged user namespaces" in refused.stdout
        assert "RAN 42 [] True" in opted_out.stdout, opted_out.stderr[-2000:]
    else:
        assert "REFUSED the sandbox refuses to run model-written code here: no seccomp allowlist: the Python " \
               "package pyseccomp or the system library libseccomp (Debian: libseccomp2) is missing" in \
               refused.stdout, refused.stderr[-2000:]
        assert "RAN 42 ['user', 'pid', 'net', 'mount', 'ipc', 'uts'] False" in opted_out.stdout, opted_out.stderr
    assert "SERA_SANDBOX_UNISOLATED=1" in refused.stdout
    assert "WARNING: sera sandbox runs model-written code WITHOUT ISOLATION" in opted_out.stderr
    assert "WARNING" not in refused.stderr


def test_host_decoding_is_strict_and_bounded():
    ok = {"t": "call", "id": 1, "name": "craft", "a": {"l": []}, "k": {"d": []}, "async": False}
    assert check_frame(dict(ok), ("call",)) == ok
    for bad in ({**ok, "id": [1]}, {**ok, "id": True}, {**ok, "id": -1}, {**ok, "extra": 1}, {**ok, "name": 3},
                {**ok, "t": "done"}, [1, 2], {"t": "done", "n": 1, "out": {}, "err": "", "ok": True}):
        with pytest.raises(ValueError):
            check_frame(bad, ("call", "done"))
    assert decode_value({"d": [[1, "a"], ["k", {"t": [1, 2.5]}], [None, True]]}) == {1: "a", "k": (1, 2.5), None: True}
    for bad in ({"d": [[{"t": [1, 2]}, 0]]}, {"d": [[2 ** 61 - 1, 0]]}, {"d": [[float("inf"), 0]]},
                {"l": [0] * (MAX_ENTRIES + 1)}, {"d": [[1, 2, 3]]}, {"x": []}):
        with pytest.raises(ValueError):
            decode_value(bad)
    # colliding int keys (all hash to 0) are refused at the first one, in microseconds, not decoded in seconds
    t0 = time.perf_counter()
    with pytest.raises(ValueError):
        decode_value({"d": [[k * (2 ** 61 - 1), 0] for k in range(1, 30000)]})
    assert time.perf_counter() - t0 < 0.5


def test_a_cell_cannot_make_the_host_raise():
    async def main():
        sb = Sandbox(["tool"], ["later"], LIMITS)
        pre = ("g = [c for c in ().__class__.__base__.__subclasses__() if c.__name__ == '_wrap_close'][0]"
               ".__init__.__globals__\ng['sys'].modules['__main__'].TRUSTED[0] = 1\nsend = tool.__globals__['send']\n")
        out = []
        for frame in ("{'t': 'call', 'id': [1], 'name': 'later', 'a': {'l': []}, 'k': {'d': []}, 'async': True}",
                      "{'t': 'call', 'id': 1, 'name': 'tool', 'a': {'l': [{'d': [[(1, 2), 0]]}]}, 'k': {'d': []}, "
                      "'async': False}", "{'t': 'ready'}", "[1]", "{'t': 'done', 'n': 'x'}"):
            out.append(await sb.run_cell(pre + f"send({frame})\nimport time\ntime.sleep(1)", lambda *a: None))
        await sb.close()
        return out

    out = _run(main())
    assert [r.limit for r in out] == ["killed", None, "killed", "killed", "killed"]
    assert all("protocol violation" in r.error for r in out if r.limit == "killed")
