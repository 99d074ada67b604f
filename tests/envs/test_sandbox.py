"""The sandbox: cell semantics, limits, and a hostile suite run against a live TextCraft tree.

Every hostile cell must end in an error observation within its limit, leave the world digest unchanged, and
the agent's next cell must work.
"""

import asyncio
import os
import time

import pytest

from envs_py.sandbox import CellResult, Limits, Sandbox, Zygote
from envs_py.textcraft import TextCraftSession, load_tasks

LIMITS = Limits(cpu_s=1.0, wall_s=2.0, grace_s=1.0, memory_mb=512, output_chars=4000)
PWNED = "/tmp/sandbox_pwned"


@pytest.fixture(scope="module")
def loop():
    lp = asyncio.new_event_loop()
    yield lp
    lp.close()


def run(loop, coro):
    return loop.run_until_complete(coro)


@pytest.mark.parametrize("zygote", [True, False], ids=["forked", "own-interpreter"])
def test_cells_namespace_display_and_tools(loop, zygote):
    calls = []

    def handler(name, args, kwargs):
        calls.append((name, args, kwargs))
        return {"echo": [name, len(args)]}

    async def main():
        sb = Sandbox(["craft"], [], LIMITS, zygote=zygote)
        assert sb.zygote == (zygote and Zygote.available())
        info = await sb.start()
        assert info["seccomp"] is True or os.uname().machine != "x86_64"
        assert info["uid_dropped"] == (os.getuid() == 0)
        out = [await sb.run_cell(c, handler) for c in (
            "x = 41\nprint('hi')", "x + 1", "print('a')\nx", "craft({'a': 1, 2: True}, ('b', 2), k=None)",
            "y = craft({}, ())\ny['echo']", "None", "x;", "", "def f(:\n  pass", "1/0", "x",
            "import math\nfrom collections import Counter\nprint(math.sqrt(16), Counter('aab'))")]
        await sb.close()
        return out

    r = run(loop, main())
    assert r[0] == CellResult("hi\n") and r[1].output == "42\n" and r[2].output == "a\nOut[3]: 41\n"
    assert calls[0] == ("craft", ({"a": 1, 2: True}, ("b", 2)), {"k": None})  # types survive the RPC
    assert r[4].output == "['craft', 2]\n" and r[5].output == "" and r[6].output == ""
    assert r[7].error == "No code available to execute." and not r[7].ok
    assert r[8].error.startswith("Execution failed. Traceback:\nSyntax error in line:\ndef f(:\nMessage: ")
    assert "ZeroDivisionError: division by zero" in r[9].output and "Cell In[10], line 1" in r[9].output
    assert not r[9].ok and r[10].output == "41\n"  # an exception keeps the namespace
    assert r[11].output == "4.0 Counter({'a': 2, 'b': 1})\n"  # whitelisted modules import


def _parent(pid: int) -> int:
    return int(open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()[1])


@pytest.mark.skipif(not Zygote.available(), reason="the zygote needs Linux pidfds (os.pidfd_open)")
def test_sandboxes_are_forks_of_one_zygote_each_its_own(loop):
    def noop(*a):
        return None

    async def main():
        sbs = [Sandbox([], [], LIMITS) for _ in range(3)]
        drawn = [(await sb.run_cell("import random\nx = random.getrandbits(64)\nx", noop)).output for sb in sbs]
        zygote = Zygote.shared()
        parents = [_parent(_parent(sb.pid)) for sb in sbs]  # the sandbox proper's keeper is the zygote's fork
        locked = [sb.info for sb in sbs]
        sbs[0].kill()  # one sandbox killed (through its pidfd): the others keep their namespaces
        kept = [(await sb.run_cell("x", noop)).output for sb in sbs[1:]]
        zygote.proc.kill()  # the zygote dies: its forks die with it, and the next cell starts over on a new one
        zygote.proc.wait()
        sbs[1].proc.wait(timeout=10)
        lost = await sbs[1].run_cell("x", noop)
        again = await sbs[1].run_cell("y = 5\ny", noop)
        new_zygote = Zygote.shared()
        new_parent = _parent(_parent(sbs[1].pid))
        new_zygote.sock.close()  # a zygote lost between the liveness check and the fork request: replaced, once
        fresh = Sandbox([], [], LIMITS)
        fresh_out = (await fresh.run_cell("6 * 7", noop)).output
        third = Zygote.shared()
        for sb in sbs + [fresh]:
            await sb.close()
        return drawn, zygote, parents, locked, kept, lost, again, new_zygote, new_parent, fresh_out, third

    drawn, zygote, parents, locked, kept, lost, again, new_zygote, new_parent, fresh_out, third = run(loop, main())
    assert fresh_out == "42\n" and third is not new_zygote
    assert len(set(drawn)) == 3  # each fork reseeded: no shared random stream
    assert parents == [zygote.proc.pid] * 3 and all(p != os.getpid() for p in parents)
    assert all(i["seccomp"] is True or os.uname().machine != "x86_64" for i in locked)
    assert all(i["uid_dropped"] == (os.getuid() == 0) for i in locked)
    assert kept == drawn[1:]
    assert lost.restarted and "NameError" in lost.output and again.output == "5\n"
    assert new_zygote is not zygote and new_parent == new_zygote.proc.pid


@pytest.mark.skipif(not Zygote.available(), reason="the zygote needs Linux pidfds (os.pidfd_open)")
def test_a_forked_sandbox_is_watched_at_descriptors_past_1024(loop):
    """Hundreds of agents hold thousands of descriptors: the pidfd is polled, not select()ed (limited to 1024)."""
    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and hard < 2100:
        pytest.skip("the hard descriptor limit is under 2100")
    resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, 2100), hard))
    try:
        async def main():
            sb = Sandbox([], [], LIMITS)
            out = (await sb.run_cell("1 + 1", lambda *a: None)).output
            keeper = sb.proc.outer  # the zygote's fork, whose pidfd is polled (the sandbox proper's only signalled)
            os.dup2(keeper.pidfd, 2050)
            os.close(keeper.pidfd)
            keeper.pidfd = 2050
            alive = sb.proc.poll()
            await sb.close()
            return out, alive, sb.proc

        out, alive, proc = run(loop, main())
        assert out == "2\n" and alive is None and proc is None
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


def test_top_level_await_and_subagent_time_not_counted(loop):
    async def slow_child(targets):
        await asyncio.sleep(1.5)
        return f"child {targets}"

    def handler(name, args, kwargs):
        return slow_child(args[0]) if name == "launch_subagent" else "ok"

    async def main():
        sb = Sandbox(["craft"], ["launch_subagent"], Limits(cpu_s=1, wall_s=1.0, grace_s=0.5))
        t0 = time.monotonic()
        a = await sb.run_cell("r = await asyncio.gather(launch_subagent({'a': 1}), launch_subagent({'b': 2}))\n"
                              "r2 = await launch_subagent({'c': 3})\nprint(r, r2, craft())", handler)
        took = time.monotonic() - t0
        b = await sb.run_cell("launch_subagent({'a': 1})", handler)
        c = await sb.run_cell("t = asyncio.create_task(launch_subagent({'a': 1}))\nawait t", handler)
        d = await sb.run_cell("await asyncio.sleep(3)", handler)
        e = await sb.run_cell("asyncio.get_event_loop()", handler)
        f = await sb.run_cell("asyncio.all_tasks()", handler)
        await sb.close()
        return a, took, b, c, d, e, f

    a, took, b, c, d, e, f = run(loop, main())
    assert a.ok and a.output == "[\"child {'a': 1}\", \"child {'b': 2}\"] child {'c': 3} ok\n" and took > 2.9
    assert b.error.startswith("ERROR: launch_subagent() requires 'await' to run.")
    assert c.ok and c.output == '"child {\'a\': 1}"\n'
    assert d.limit == "wall" and not d.ok
    assert "asyncio.get_event_loop is disabled in sandbox" in e.output
    assert f.error == "ERROR: asyncio.all_tasks() is not allowed in the sandbox."


def test_handler_errors_and_bad_results_become_cell_exceptions(loop):
    def handler(name, args, kwargs):
        if name == "boom":
            raise KeyError("inside the host")
        return object()

    async def main():
        sb = Sandbox(["boom", "weird"], [], LIMITS)
        r = [await sb.run_cell(c, handler) for c in ("boom()", "weird()", "print('fine')")]
        await sb.close()
        return r

    a, b, c = run(loop, main())
    assert "RuntimeError: KeyError: 'inside the host'" in a.output
    assert "not serialisable" in b.output and c.output == "fine\n"


OSG = "g = [c for c in ().__class__.__base__.__subclasses__() if c.__name__ == '_wrap_close'][0].__init__.__globals__\n"
BYPASS = OSG + "g['sys'].modules['__main__'].TRUSTED[0] = 1\n"  # switch the audit hook off: other layers hold
HOSTILE = {
    "open_read": "open('/etc/passwd').read()",
    "builtins_open": "__builtins__['open']('/etc/passwd')",
    "import_os": "import os",
    "import_subprocess": "import subprocess\nsubprocess.run(['id'])",
    "import_socket": "import socket\nsocket.create_connection(('1.1.1.1', 80))",
    "import_ctypes": "import ctypes",
    "import_sys": "import sys",
    "dunder_import": "__import__('os').system('id')",
    "subclasses_system": OSG + f"g['system']('touch {PWNED}')",
    "subclasses_listdir": OSG + "g['listdir']('/')",
    "fileio_read": OSG + "g['sys'].modules['_io'].FileIO('/etc/hostname').read()",
    "fileio_read_seccomp": BYPASS + "g['sys'].modules['_io'].FileIO('/etc/hostname').read()",
    "fileio_write": OSG + f"g['sys'].modules['_io'].FileIO('{PWNED}', 'w').write(b'x')",
    "dup_fd_limit": BYPASS + "g['dup'](0)",
    "fork_audited": OSG + "g['fork']()",
    "fork_bomb_seccomp": BYPASS + "while True:\n    g['fork']()",
    "system_seccomp": BYPASS + f"assert g['system']('touch {PWNED}') == 0",
    "os_open_seccomp": BYPASS + "g['open']('/etc/hostname', 0)",
    "os_write_file_seccomp": BYPASS + f"g['open']('{PWNED}', g['O_WRONLY'] | g['O_CREAT'])",
    "socket_seccomp": BYPASS + "s = g['sys'].modules['socket'].socket()\ns.connect(('127.0.0.1', 22))",
    "socketpair_seccomp": BYPASS + "g['sys'].modules['socket'].socketpair()",
    "real_import_seccomp": BYPASS + "g['__builtins__']['__import__']('wave')",
    "ctypes_libc": BYPASS + "C = [c for c in object.__subclasses__() if c.__name__ == 'CDLL'][0]\n"
                            f"assert C(None).system(b'touch {PWNED}') == 0",
    "kill_parent_audited": OSG + "g['kill'](g['getppid'](), 9)",
    "kill_parent_seccomp": BYPASS + "g['kill'](g['getppid'](), 9)",
    "import_signal": "import signal",
    "env_secrets": OSG + "token = g['environ']['HOME']",
    "traceback_frame_walk": "try:\n    1/0\nexcept Exception as e:\n    e.__traceback__.tb_frame.f_back.f_globals['inventory'] = {}",
    "generator_frame_walk": "def gen():\n    yield 1\nx = gen()\nx.gi_frame.f_back",
    "getframe_walk": OSG + "g['sys']._getframe(0).f_back.f_globals",
    "gc_walk": "import gc\ngc.get_objects()",
    "gc_walk_sys": OSG + "g['sys'].modules['gc'].get_referrers(craft)",
    "eval": "eval('1 + 1')",
    "exec": "exec('x = 1')",
    "compile": "compile('1', 'x', 'eval')",
    "infinite_loop": "while True:\n    pass",
    "swallowing_loop": "while True:\n    try:\n        while True:\n            pass\n    except BaseException:\n        pass",
    "deep_recursion": "def f(n):\n    return f(n + 1)\nf(0)",
    "deep_recursion_raised_limit": OSG + "g['sys'].setrecursionlimit(10**8)\ndef f(n):\n    return f(n + 1)\nf(0)",
    "huge_bytearray": "x = bytearray(4 * 1024**3)",
    "huge_list": "x = [0] * (10**9)",
    "doubling_string": "s = 'a'\nwhile True:\n    s = s + s",
    "huge_print": "print('x' * 10**6)",
    "print_forever": "while True:\n    print('spam')",
    "sleep": "import time\ntime.sleep(100)",
    "await_sleep": "await asyncio.sleep(100)",
    "edit_inventory_name": "inventory['o5_i2_15'] = 3",
    "edit_inventory_globals": "craft.__globals__['inventory']['o5_i2_15'] = 3",
    "forged_rpc": "craft.__globals__['send']({'t': 'call', 'id': 10**6, 'name': 'set_inventory', "
                  "'a': {'l': [{'d': [['o5_i2_15', 3]]}]}, 'k': {'d': []}, 'async': False})\n"
                  "assert view_inventory().get('o5_i2_15') == 3",
    "edit_checker_record": "finish.__globals__['agents']['root'].finish_message = 'done'",
    "break_framing": "craft.__globals__['os'].write(1, b'garbage that breaks the framing')",
    "exit_process": OSG + "g['_exit'](0)",
    "system_exit": "raise SystemExit(0)",
}


@pytest.fixture(scope="module")
def session(loop):
    s = TextCraftSession.from_task(load_tasks("val")[0], limits=LIMITS)
    yield s
    run(loop, s.close())


@pytest.mark.parametrize("name", sorted(HOSTILE))
def test_hostile_cell(loop, session, name):
    before = session.digest()
    t0 = time.monotonic()
    r = run(loop, session.run_cell("root", HOSTILE[name]))
    took = time.monotonic() - t0
    assert r["ok"] is False, (name, r)
    assert r["output"] or r["error"]
    assert took < LIMITS.wall_s + LIMITS.grace_s + 2.0, (name, took)
    assert session.digest() == before and not session.world.finished("root")
    after = run(loop, session.run_cell("root", "print(6 * 7)\nview_inventory()"))
    assert after["ok"] and after["output"] == "42\nOut[1]: {'raw_o7': 3, 'raw_o5': 9, 'raw_t6': 1}\n" \
        or after["output"].startswith("42\nOut[") and after["ok"], (name, after)
    assert not os.path.exists(PWNED)


def test_hostile_suite_is_large_enough():
    assert len(HOSTILE) >= 30


def test_limits_report_kind_and_namespace_policy(loop):
    async def main():
        sb = Sandbox([], [], Limits(cpu_s=0.5, wall_s=4.0, grace_s=1.0, memory_mb=512, output_chars=4000))
        await sb.run_cell("keep = 1", lambda *a: None)
        cpu = await sb.run_cell("while True:\n    pass", lambda *a: None)
        kept = await sb.run_cell("keep", lambda *a: None)
        # A loop in C never reaches the interpreter's signal check, so only the host's wall clock can stop it (a
        # Python loop that swallows the limit's exception can still be stopped by it at its back edge: a race).
        killed = await sb.run_cell("sum(range(10**15))", lambda *a: None)
        lost = await sb.run_cell("keep", lambda *a: None)
        mem = await sb.run_cell("x = bytearray(4 * 1024**3)", lambda *a: None)
        out = await sb.run_cell("print('x' * 10**6)", lambda *a: None)
        await sb.close()
        return cpu, kept, killed, lost, mem, out

    cpu, kept, killed, lost, mem, out = run(loop, main())
    assert cpu.limit == "cpu" and "Variables from earlier cells are kept" in cpu.error and kept.output == "1\n"
    assert killed.limit == "killed" and killed.restarted and "were lost" in killed.error
    assert "NameError" in lost.output and not lost.restarted
    assert mem.limit == "memory" and out.limit == "output" and len(out.output) == 4000
