"""The sandbox process (run as a script by :mod:`envs_py.sandbox`; standard library, its sibling
``sandbox_jail.py`` and ``pyseccomp``, found where the host says).

It pre-imports what cells may use, locks itself down (namespaces, empty root, uid 65534, rlimits, seccomp
allowlist: ``sandbox_jail``; then the audit hook), then runs cells one by one in a persistent namespace. Tool stubs
in that namespace forward every call to the host as a frame and return its answer. See sandbox.py for the threat
model.
"""

import asyncio
import builtins
import json
import os
import pprint
import select
import signal
import struct
import sys
# Modules a cell may import; all loaded now, since nothing can be opened after the lockdown.
import bisect, collections, collections.abc, copy, dataclasses, datetime, decimal, enum, fractions  # noqa: E401, F401
import functools, heapq, itertools, math, operator, random, re, statistics, string, textwrap, time  # noqa: E401, F401
import typing  # noqa: F401

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import sandbox_jail as jail
from sandbox_cell_code import format_exception, precheck

ALLOWED_IMPORTS = {"bisect", "collections", "collections.abc", "copy", "dataclasses", "datetime", "decimal", "enum",
                   "fractions", "functools", "heapq", "itertools", "math", "operator", "pprint", "random", "re",
                   "statistics", "string", "textwrap", "time", "typing", "json", "asyncio"}
REMOVED_BUILTINS = ("open", "eval", "exec", "compile", "input", "breakpoint", "help", "exit", "quit", "__loader__",
                    "__spec__", "copyright", "credits", "license")
ASYNCIO_ALLOWED = ("gather", "sleep", "create_task", "wait", "wait_for", "as_completed", "shield", "Lock", "Event",
                   "Semaphore", "BoundedSemaphore", "Condition", "Queue", "LifoQueue", "PriorityQueue", "timeout",
                   "TimeoutError", "CancelledError", "QueueEmpty", "QueueFull", "FIRST_COMPLETED",
                   "FIRST_EXCEPTION", "ALL_COMPLETED", "ensure_future", "iscoroutine")
HDR = struct.Struct("<I")
ZYGOTE = sys.argv[1:2] == ["--zygote"]
CONFIG = {} if ZYGOTE else json.loads(sys.argv[1])  # a zygote's forks get theirs with the fork request
PARENT = os.getppid()  # the host (a zygote's forks: the zygote); the sandbox dies with it
OPTIONS = json.loads(sys.argv[2]) if ZYGOTE else CONFIG


SECCOMP = jail.import_seccomp(OPTIONS.get("lib"))
FILTER = jail.build_filter(SECCOMP)  # built once (in a zygote, once for all its forks), loaded by each sandbox
TRUSTED = [1]  # audit events are allowed while the runner itself works (set to 0 around cell code)


class CellLimit(BaseException):
    """Raised into a cell that broke a limit (a BaseException, so ``except Exception`` does not swallow it)."""


# -- framing --------------------------------------------------------------------------------------------------
_inbuf = bytearray()
_pending = {}  # async call id -> future
_replies = {}  # sync replies that arrived while waiting for another one
_next_id = [0]


def send(frame):
    body = json.dumps(frame, separators=(",", ":")).encode()
    data = HDR.pack(len(body)) + body
    while data:
        n = os.write(1, data)
        data = data[n:]


def _take_frame():
    if len(_inbuf) < 4:
        return None
    (n,) = HDR.unpack_from(_inbuf)
    if len(_inbuf) < 4 + n:
        return None
    body = bytes(_inbuf[4:4 + n])
    del _inbuf[:4 + n]
    return json.loads(body)


def _fill(block):
    if block:
        select.select([0], [], [])
    try:
        data = os.read(0, 1 << 16)
    except BlockingIOError:
        return
    if not data:
        os._exit(0)  # host went away
    _inbuf.extend(data)


def recv():
    while True:
        frame = _take_frame()
        if frame is not None:
            return frame
        _fill(True)


def _dispatch(frame):
    fut = _pending.pop(frame.get("id"), None)
    if fut is None:
        _replies[frame.get("id")] = frame
    elif not fut.done():
        if "err" in frame:
            fut.set_exception(RuntimeError(frame["err"]))
        else:
            fut.set_result(frame.get("v"))


def _on_readable():
    _fill(False)
    while True:
        frame = _take_frame()
        if frame is None:
            return
        _dispatch(frame)


def encode(x, depth=0):
    if depth > 60:
        raise ValueError("tool argument nested too deeply")
    if x is None or type(x) in (bool, int, float, str):
        return x
    if isinstance(x, bool):
        return bool(x)
    if isinstance(x, int):
        return int(x)
    if isinstance(x, str):
        return str(x)
    if isinstance(x, float):
        return float(x)
    if isinstance(x, tuple):
        return {"t": [encode(e, depth + 1) for e in x]}
    if isinstance(x, list):
        return {"l": [encode(e, depth + 1) for e in x]}
    if isinstance(x, dict):
        return {"d": [[encode(k, depth + 1), encode(v, depth + 1)] for k, v in x.items()]}
    return {"o": type(x).__name__}


# -- tool stubs -----------------------------------------------------------------------------------------------
_state = {"awaiting": 0, "wall_left": 0.0}


def _call_frame(name, args, kwargs, is_async):
    _next_id[0] += 1
    cid = _next_id[0]
    send({"t": "call", "id": cid, "name": name, "a": encode(list(args)), "k": encode(dict(kwargs)),
          "async": is_async})
    return cid


def make_sync_tool(name):
    def tool(*args, **kwargs):
        cid = _call_frame(name, args, kwargs, False)
        while cid not in _replies:
            _dispatch(recv())
        frame = _replies.pop(cid)
        if "err" in frame:
            raise RuntimeError(frame["err"])
        return frame.get("v")
    tool.__name__ = tool.__qualname__ = name
    return tool


def make_async_tool(name, loop):
    async def tool(*args, **kwargs):
        fut = loop.create_future()
        cid = _call_frame(name, args, kwargs, True)
        _pending[cid] = fut
        if _state["awaiting"] == 0:  # the wall clock stops while awaiting sub-agents
            _state["wall_left"] = signal.setitimer(signal.ITIMER_REAL, 0)[0]
        _state["awaiting"] += 1
        try:
            return await fut
        finally:
            _state["awaiting"] -= 1
            if _state["awaiting"] == 0 and _state["wall_left"] > 0:
                signal.setitimer(signal.ITIMER_REAL, _state["wall_left"], 0.2)
    tool.__name__ = tool.__qualname__ = name
    return tool


class AsyncioFacade:
    """What ``asyncio`` is inside a cell: the coordination primitives only."""

    def __init__(self):
        for n in ASYNCIO_ALLOWED:
            object.__setattr__(self, n, getattr(asyncio, n))

    def __getattr__(self, name):
        raise RuntimeError(f"asyncio.{name} is disabled in sandbox. Available: {', '.join(ASYNCIO_ALLOWED)}")


FACADE = AsyncioFacade()


def safe_import(name, globals=None, locals=None, fromlist=(), level=0):
    if level or name not in ALLOWED_IMPORTS:
        raise ImportError(f"import of '{name}' is not allowed in the sandbox")
    if name == "asyncio":
        return FACADE
    module = sys.modules[name]
    return module if fromlist or "." not in name else sys.modules[name.split(".")[0]]


def new_namespace(loop):
    b = dict(builtins.__dict__)
    for n in REMOVED_BUILTINS:
        b.pop(n, None)
    b["__import__"] = safe_import
    ns = {"__name__": "__main__", "__builtins__": b, "asyncio": FACADE}
    for n in CONFIG["sync"]:
        ns[n] = make_sync_tool(n)
    for n in CONFIG["async"]:
        ns[n] = make_async_tool(n, loop)
    return ns


# -- lockdown -------------------------------------------------------------------------------------------------
BLOCKED_EVENTS = {"open", "import", "sys._current_frames", "sys.settrace",
                  "sys.setprofile", "gc.get_objects", "gc.get_referrers", "gc.get_referents", "code.__new__",
                  "builtins.input", "mmap.__new__", "function.__new__"}
BLOCKED_PREFIXES = ("os.", "subprocess.", "socket.", "ctypes.", "shutil.", "signal.", "resource.", "fcntl.",
                    "pty.", "syslog.", "sqlite3.", "urllib.", "_posixsubprocess", "tempfile.", "glob.", "pathlib.",
                    "sys.monitoring", "cpython.")
FRAME_ATTRS = {"tb_frame", "gi_frame", "cr_frame", "ag_frame", "f_code", "f_back", "f_globals", "f_locals",
               "f_builtins"}


def audit_hook(event, args, _t=TRUSTED, _b=BLOCKED_EVENTS, _p=BLOCKED_PREFIXES, _f=FRAME_ATTRS):
    if _t[0]:
        return
    if event in _b or event.startswith(_p) or (event == "object.__getattr__" and args[1] in _f):
        raise PermissionError(f"{event} is not allowed in the sandbox")
    if event == "sys._getframe":  # ValueError: what namedtuple/typing expect when frames are unavailable
        raise ValueError("sys._getframe is not allowed in the sandbox")


def refuse(why):
    send({"t": "refused", "why": why})
    os._exit(3)


def lockdown(parent):
    """Enters every layer (see sandbox_jail); returns the ready message's layer report."""
    open_fds = []
    for fd in [int(f) for f in os.listdir("/proc/self/fd")]:
        try:
            os.fstat(fd)
            open_fds.append(fd)
        except OSError:
            pass  # the listing's own, now closed, directory fd
    unisolated = OPTIONS.get("unisolated") is True
    if FILTER is None and not unisolated:
        refuse("no seccomp allowlist: the Python package pyseccomp or the system library libseccomp "
               "(Debian: libseccomp2) is missing")
    was_root = os.getuid() == 0
    try:
        layers = jail.isolate(parent, lambda pid: send({"t": "jail", "pid": pid}))
    except jail.Refused as e:
        if not unisolated:
            refuse(f"no namespaces: {e}; as an ordinary user this needs unprivileged user namespaces "
                   "(sysctl user.max_user_namespaces > 0, kernel.unprivileged_userns_clone = 1, no AppArmor "
                   "restriction on them)")
        layers = {**jail.drop_uid_only(parent), "refused": str(e)}
    layers["rlimits"] = jail.set_rlimits(CONFIG, open_fds)
    jail.dumpable(False)
    if FILTER is not None:
        jail.load_filter(SECCOMP, FILTER)  # last: it also forbids setrlimit
    layers["seccomp"] = "allowlist (libseccomp)" if FILTER is not None else "none"
    sys.addaudithook(audit_hook)
    return {"uid_dropped": was_root, "seccomp": FILTER is not None, "uid": os.getuid(), "layers": layers}


# -- cells ----------------------------------------------------------------------------------------------------
class BoundedOut:
    def __init__(self, limit):
        self.parts, self.size, self.limit, self.overflow = [], 0, limit, False

    def write(self, s):
        s = str(s)
        if self.size + len(s) > self.limit:
            self.parts.append(s[: max(0, self.limit - self.size)])
            self.size = self.limit
            self.overflow = True
            raise CellLimit("output")
        self.parts.append(s)
        self.size += len(s)
        return len(s)

    def flush(self):
        pass

    def getvalue(self):
        return "".join(self.parts)


def on_limit(kind):
    def handler(signum, frame):
        raise CellLimit(kind)
    return handler


def run_cell(ns, n, code, loop):
    out = BoundedOut(CONFIG["out"])
    err, ok, limit = "", True, None
    compiled, err, show = precheck(code, n, CONFIG["forbidden"], CONFIG["async"])
    if compiled is None:
        send({"t": "done", "n": n, "out": "", "err": err, "ok": False})
        return
    errs = BoundedOut(CONFIG["out"])
    sys.stdout, sys.stderr = out, errs  # stderr is the observation's error text, as upstream
    _state["awaiting"] = 0
    try:
        signal.setitimer(signal.ITIMER_PROF, CONFIG["cpu_s"], 0.2)
        signal.setitimer(signal.ITIMER_REAL, CONFIG["wall_s"], 0.2)
        TRUSTED[0] = 0
        if compiled.co_flags & 0x80:  # CO_COROUTINE: the cell uses top-level await
            loop.run_until_complete(eval(compiled, ns))
        else:
            exec(compiled, ns)
        value = ns.pop("__cell_value__", None)
        if show and value is not None:
            text = pprint.pformat(value, sort_dicts=False)
            out.write(text + "\n" if not out.size else f"Out[{n}]: {text}\n")
    except CellLimit as e:
        ok, limit = False, e.args[0] if e.args else "wall"
    except MemoryError as e:
        ok, limit = False, "memory"
        TRUSTED[0] = 1
        out.parts.append(format_exception(e, n, code.splitlines()))
    except BaseException as e:  # noqa: BLE001  (SystemExit, KeyboardInterrupt included: the process lives on)
        ok = False
        TRUSTED[0] = 1
        try:
            out.write(format_exception(e, n, code.splitlines()))
        except CellLimit:
            limit = "output"
    finally:
        TRUSTED[0] = 1
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.setitimer(signal.ITIMER_PROF, 0)
        sys.stdout, sys.stderr = sys.__stdout__, sys.__stderr__
        for task in asyncio.all_tasks(loop):
            task.cancel()
    if limit is None and (out.overflow or errs.overflow):
        limit = "output"
    err = errs.getvalue()
    messages = {"cpu": f"the cell exceeded its CPU time limit ({CONFIG['cpu_s']:g} s) and was stopped",
                "wall": f"the cell exceeded its wall-clock limit ({CONFIG['wall_s']:g} s) and was stopped",
                "memory": f"the cell exceeded its memory limit ({CONFIG['memory'] >> 20} MiB)",
                "output": f"the cell printed more than {CONFIG['out']} characters; output truncated and the "
                          "cell stopped"}
    if limit:
        err += f"Error: {messages.get(limit, limit)}. Variables from earlier cells are kept."
    send({"t": "done", "n": n, "out": out.getvalue(), "err": err, "ok": ok, "limit": limit})


def main(parent=PARENT):
    loop = asyncio.new_event_loop()
    asyncio.set_event_loop(loop)
    os.set_blocking(0, False)
    loop.add_reader(0, _on_readable)
    signal.signal(signal.SIGPROF, on_limit("cpu"))
    signal.signal(signal.SIGALRM, on_limit("wall"))
    info = lockdown(parent)
    ns = new_namespace(loop)
    send({"t": "ready", **info})
    while True:
        frame = recv()
        if frame.get("t") == "cell":
            run_cell(ns, frame.get("n", 0), frame.get("code", ""), loop)
        elif frame.get("t") == "ret":
            _dispatch(frame)


def zygote():
    """Serves fork requests from the host (``sandbox.Zygote``): each is a frame of the new sandbox's config over
    the unix socket on fd 0, carrying the sandbox's stdin and stdout pipes. The fork locks itself down and runs
    ``main`` exactly as a freshly started sandbox does; the zygote replies with the fork's pid and a pidfd for it.
    The interpreter start and the pre-imports (~0.1 s of CPU) are paid once here instead of once per agent."""
    import socket

    sock = socket.socket(fileno=os.dup(0))
    null = os.open(os.devnull, os.O_RDWR)
    os.dup2(null, 0)  # keep fd 0 taken, so received descriptors are never 0 or 1
    os.close(null)
    # No parent-death signal here (it would fire when the host *thread* that started the zygote ends): the zygote
    # ends when the host's end of the socket closes, and each fork dies with the zygote (its own PDEATHSIG).
    signal.signal(signal.SIGCHLD, signal.SIG_IGN)  # the kernel reaps the forks
    me = os.getpid()
    while True:
        try:
            msg, fds, _, _ = socket.recv_fds(sock, 1 << 16, 2)
        except OSError:
            os._exit(0)
        if not msg:
            os._exit(0)  # the host closed its end
        if len(fds) != 2:
            for fd in fds:
                os.close(fd)
            sock.send(b'{"error": "a fork request carries exactly two descriptors"}')
            continue
        pid = os.fork()
        if pid == 0:
            try:
                sock.close()
                signal.signal(signal.SIGCHLD, signal.SIG_DFL)
                os.dup2(fds[0], 0)
                os.dup2(fds[1], 1)
                os.close(fds[0])
                os.close(fds[1])
                global CONFIG
                CONFIG = json.loads(msg)
                random.seed()  # each fork its own stream, as a fresh interpreter would have
                main(me)
            finally:
                os._exit(1)
        for fd in fds:
            os.close(fd)
        try:
            pidfd = [os.pidfd_open(pid)]
        except OSError:  # it already exited (and was reaped): the host sees a sandbox that died at once
            pidfd = []
        socket.send_fds(sock, [json.dumps({"pid": pid}).encode()], pidfd)
        for fd in pidfd:
            os.close(fd)


if __name__ == "__main__":
    zygote() if ZYGOTE else main()
