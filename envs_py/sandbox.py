"""A sandbox for model-written Python cells: one persistent, locked-down process per agent.

Host side (any asyncio process, e.g. an env worker): :class:`Sandbox` runs ``sandbox_child.py`` (stdlib only, so the
child imports nothing of ours) under ``python -I -S`` with an empty environment. The child pre-imports the modules
cells may use, then locks itself down before it runs any cell. On Linux a sandbox is a fork of a :class:`Zygote` (one
such interpreter per host process that has done the pre-imports and never runs a cell), so an agent's sandbox costs
a fork instead of an interpreter start; the fork locks itself down in the same way:

* drops to uid/gid 65534 when started as root (so rlimits bind and nothing of root's is reachable);
* rlimits: no new processes or threads (NPROC 0), no file writes (FSIZE 0), no new file descriptors (NOFILE =
  the fds already open), an address-space cap, no core files, a lifetime CPU cap;
* a seccomp filter (x86-64) that fails fork/clone/exec, sockets, open, kill/signals to others, ptrace,
  setrlimit/setuid and similar calls with EPERM;
* an audit hook that refuses file opens, os/subprocess/socket/ctypes/signal/gc-walking/frame events;
* a cell namespace whose builtins lack open/eval/exec/compile/input and whose ``__import__`` only hands out a
  whitelist of pre-imported modules (``asyncio`` is a restricted facade).

The child holds no world state: every tool call, ``launch_subagent`` included, is an RPC answered by the host's
handler, which validates it. Per cell the child enforces CPU (ITIMER_PROF) and wall-clock (ITIMER_REAL, paused
while awaiting async tool calls such as sub-agents) limits and an output cap; the host kills the process after
wall + grace seconds (again not counting time awaiting async tools), or on a crash or protocol violation, and
starts a fresh one: the cell's observation says the namespace was lost. Frames are 4-byte lengths + JSON; the
host decodes child messages with ``json`` only (never pickle/marshal).

The process-level layers (uid, rlimits, seccomp, no world state) are the boundary. The audit hook and the
namespace restrictions run inside the untrusted process, so determined code can switch them off (the tests do);
they are there to give model code clear error messages early, and as a second layer.
"""

from __future__ import annotations

import asyncio
import collections
import dataclasses
import inspect
import json
import os
import select
import signal
import socket
import struct
import subprocess
import sys
import threading
from typing import Any, Callable

_HDR = struct.Struct("<I")
MAX_FRAME = 4 << 20
_CHILD = os.path.join(os.path.dirname(os.path.abspath(__file__)), "sandbox_child.py")
ToolHandler = Callable[[str, tuple, dict], Any]


class Zygote:
    """A fork server for sandboxes: one ``sandbox_child.py --zygote`` process per host process, started as a sandbox
    is (isolated interpreter, empty environment, ``/`` as cwd) and holding the pre-imported modules. Each sandbox is a
    fork of it, which then locks itself down exactly as a freshly started sandbox does: a new sandbox costs a few ms
    of CPU instead of an interpreter start (~0.1 s of CPU, which on a small machine the rollout's device computation
    pays for). The host passes the fork's stdin and stdout pipes over a unix socket and gets back its pid and a pidfd,
    so it can signal that very process (never a reused pid). Linux only (``os.pidfd_open``); elsewhere, with
    ``Sandbox(zygote=False)`` or with ``SERA_SANDBOX_ZYGOTE=0`` in the environment (read by every process, env
    workers included: the A/B switch of ``tools/bench_job.py --no-zygote``), each sandbox is its own interpreter."""

    _shared: "Zygote | None" = None
    _shared_lock = threading.Lock()

    def __init__(self):
        mine, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        try:
            self.proc = subprocess.Popen([sys.executable, "-I", "-S", "-B", _CHILD, "--zygote"], stdin=theirs,
                                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env={}, cwd="/",
                                         close_fds=True)
        finally:
            theirs.close()
        mine.settimeout(30)
        self.sock, self.owner, self.lock = mine, os.getpid(), threading.Lock()

    @classmethod
    def available(cls) -> bool:
        return (sys.platform == "linux" and hasattr(os, "pidfd_open") and hasattr(signal, "pidfd_send_signal")
                and os.environ.get("SERA_SANDBOX_ZYGOTE", "1") != "0")

    @classmethod
    def shared(cls) -> "Zygote":
        """Returns this process's zygote, starting it (again, if it died or belongs to the process this one was
        forked from)."""
        with cls._shared_lock:
            z = cls._shared
            if z is None or z.owner != os.getpid() or z.proc.poll() is not None:
                if z is not None and z.owner == os.getpid():
                    z.close()
                cls._shared = z = Zygote()
            return z

    @classmethod
    def discard(cls) -> None:
        """Stops this process's zygote (the next ``shared()`` starts a new one); its forks die with it."""
        with cls._shared_lock:
            z, cls._shared = cls._shared, None
            if z is not None and z.owner == os.getpid():
                z.close()

    def fork(self, config: dict) -> tuple["Forked", int, int]:
        """Returns a new sandbox process for ``config`` and the host's ends of its stdin and stdout pipes."""
        to_child, to_host = os.pipe(), os.pipe()
        try:
            with self.lock:
                socket.send_fds(self.sock, [json.dumps(config).encode()], [to_child[0], to_host[1]])
                msg, fds, _, _ = socket.recv_fds(self.sock, 1 << 12, 1)
        except BaseException:
            os.close(to_child[1])
            os.close(to_host[0])
            raise
        finally:
            os.close(to_child[0])
            os.close(to_host[1])
        reply = json.loads(msg) if msg else {"error": "the zygote closed its socket"}
        if "pid" not in reply:
            for fd in fds + [to_child[1], to_host[0]]:
                os.close(fd)
            raise RuntimeError(f"sandbox zygote refused a fork: {reply.get('error')}")
        return Forked(reply["pid"], fds[0] if fds else None), to_child[1], to_host[0]

    def close(self) -> None:
        self.sock.close()
        _kill_and_wait(self.proc)


def _kill_and_wait(proc: "subprocess.Popen | Forked") -> None:
    """Kills ``proc`` if it still runs and waits up to 5 s for it to end."""
    if proc.poll() is None:
        proc.kill()
    try:
        proc.wait(timeout=5)
    except subprocess.TimeoutExpired:
        pass


class Forked:
    """A sandbox forked by the zygote (not this process's child), addressed through its pidfd: the part of
    ``subprocess.Popen`` a :class:`Sandbox` uses."""

    def __init__(self, pid: int, pidfd: int | None):
        self.pid, self.pidfd, self.returncode = pid, pidfd, None

    def _exited(self, timeout: float | None) -> bool:
        """Waits up to ``timeout`` seconds (None: for ever) for the process to exit; returns whether it has (a pidfd
        turns readable then; ``select.poll``, since fds past 1024 are common with hundreds of agents)."""
        if self.pidfd is None:
            return True
        p = select.poll()
        p.register(self.pidfd, select.POLLIN)
        return bool(p.poll(None if timeout is None else int(timeout * 1000)))

    def poll(self) -> int | None:
        if self.returncode is None and self._exited(0):
            self._ended()
        return self.returncode

    def _ended(self) -> None:
        self.returncode = -signal.SIGKILL  # the zygote reaps it; its real status is not ours to read
        if self.pidfd is not None:
            os.close(self.pidfd)
            self.pidfd = None

    def kill(self) -> None:
        if self.pidfd is not None:
            try:
                signal.pidfd_send_signal(self.pidfd, signal.SIGKILL)
            except ProcessLookupError:
                pass

    def wait(self, timeout: float | None = None) -> int:
        if not self._exited(timeout):
            raise subprocess.TimeoutExpired("sandbox", timeout)
        self._ended()
        return self.returncode


@dataclasses.dataclass(frozen=True)
class Limits:
    """Per-cell limits: CPU and wall seconds, address space, printed characters, host grace before a kill."""

    cpu_s: float = 5.0
    wall_s: float = 10.0
    memory_mb: int = 1024
    output_chars: int = 20000
    grace_s: float = 2.0
    lifetime_cpu_s: int = 3600


@dataclasses.dataclass(frozen=True)
class CellResult:
    """One cell's observation: printed output (incl. last-expression value and traceback), error text, whether
    it ran cleanly, the limit it broke (``cpu``/``wall``/``memory``/``output``/``killed``/``crashed``) if any,
    and whether the sandbox process was replaced (namespace lost)."""

    output: str
    error: str = ""
    ok: bool = True
    limit: str | None = None
    restarted: bool = False


def _encode(frame: dict) -> bytes:
    body = json.dumps(frame, separators=(",", ":")).encode()
    return _HDR.pack(len(body)) + body


class _Inbox:
    """Messages from the child, finished async tool calls and timer expiries, in arrival order."""

    def __init__(self):
        self.items: collections.deque = collections.deque()
        self.waiter: asyncio.Future | None = None

    def put(self, item: Any) -> None:
        self.items.append(item)
        if self.waiter is not None and not self.waiter.done():
            self.waiter.set_result(None)

    async def get(self) -> Any:
        while not self.items:
            self.waiter = asyncio.get_running_loop().create_future()
            await self.waiter
            self.waiter = None
        return self.items.popleft()


class _FrameReader(asyncio.Protocol):
    def __init__(self, inbox: _Inbox):
        self.inbox, self.buf = inbox, bytearray()

    def data_received(self, data: bytes) -> None:
        self.buf += data
        while len(self.buf) >= 4:
            (n,) = _HDR.unpack_from(self.buf)
            if n > MAX_FRAME:
                self.inbox.put(ValueError(f"oversized frame ({n} bytes)"))
                self.buf.clear()
                return
            if len(self.buf) < 4 + n:
                return
            body = bytes(self.buf[4:4 + n])
            del self.buf[:4 + n]
            try:
                self.inbox.put(json.loads(body))
            except (ValueError, RecursionError) as e:
                self.inbox.put(ValueError(f"undecodable frame: {e}"))

    def connection_lost(self, exc) -> None:
        self.inbox.put(None)


def decode_value(x: Any, depth: int = 0) -> Any:
    """Returns the Python value of a tagged child value (tuples, lists, dicts with any keys); unknown objects
    become a placeholder string. Raises ValueError on malformed or too deeply nested input."""
    if depth > 64:
        raise ValueError("value nested too deeply")
    if x is None or isinstance(x, (bool, int, float, str)):
        return x
    if isinstance(x, dict) and len(x) == 1:
        (tag, v), = x.items()
        if tag == "l" and isinstance(v, list):
            return [decode_value(e, depth + 1) for e in v]
        if tag == "t" and isinstance(v, list):
            return tuple(decode_value(e, depth + 1) for e in v)
        if tag == "d" and isinstance(v, list):
            out = {}
            for pair in v:
                if not isinstance(pair, list) or len(pair) != 2:
                    raise ValueError("bad dict entry")
                k = decode_value(pair[0], depth + 1)
                try:
                    out[k] = decode_value(pair[1], depth + 1)
                except TypeError:
                    raise ValueError("unhashable dict key") from None
            return out
        if tag == "o" and isinstance(v, str):
            return f"<{v[:60]} object>"
    raise ValueError("malformed value")


class Sandbox:
    """One agent's persistent sandbox process. ``await run_cell(code, handler)`` -> :class:`CellResult`.

    ``handler(name, args, kwargs)`` answers tool calls (sync or async function); its return value must be
    JSON-serialisable. Tools named in ``async_tools`` are coroutines in the cell (``await launch_subagent(...)``);
    time spent awaiting them counts toward no wall-clock limit.
    """

    def __init__(self, sync_tools=(), async_tools=(), limits: Limits = Limits(),
                 forbidden_attrs=("asyncio.all_tasks", "asyncio.current_task"), zygote: bool = True):
        self.config = {"sync": list(sync_tools), "async": list(async_tools), "forbidden": list(forbidden_attrs),
                       "cpu_s": limits.cpu_s, "wall_s": limits.wall_s, "memory": limits.memory_mb << 20,
                       "out": limits.output_chars, "life_cpu": limits.lifetime_cpu_s}
        self.limits = limits
        self.zygote = zygote and Zygote.available()
        self.proc: subprocess.Popen | Forked | None = None
        self.info: dict = {}
        self._inbox: _Inbox | None = None
        self._wtransport = None
        self._cells = 0

    @property
    def pid(self) -> int | None:
        """Returns the sandbox process id (None before start)."""
        return self.proc.pid if self.proc is not None else None

    async def start(self) -> dict:
        """Starts the process if needed and waits for it to be locked down; returns its ready message."""
        if self.proc is not None and self.proc.poll() is None:
            return self.info
        loop = asyncio.get_running_loop()
        if self.zygote:
            try:
                self.proc, stdin, stdout = Zygote.shared().fork(self.config)
            except OSError:  # the zygote died since it was last checked: start a new one, once
                Zygote.discard()
                self.proc, stdin, stdout = Zygote.shared().fork(self.config)
            stdin, stdout = os.fdopen(stdin, "wb", buffering=0), os.fdopen(stdout, "rb", buffering=0)
        else:
            self.proc = subprocess.Popen(
                [sys.executable, "-I", "-S", "-B", _CHILD, json.dumps(self.config)],
                stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, env={}, cwd="/",
                close_fds=True)
            stdin, stdout = self.proc.stdin, self.proc.stdout
        self._inbox = inbox = _Inbox()
        await loop.connect_read_pipe(lambda: _FrameReader(inbox), stdout)
        self._wtransport, _ = await loop.connect_write_pipe(asyncio.BaseProtocol, stdin)
        msg = await asyncio.wait_for(inbox.get(), timeout=30)
        if not isinstance(msg, dict) or msg.get("t") != "ready":
            self.kill()
            raise RuntimeError("sandbox process failed to start")
        self.info = msg
        self._cells = 0
        return msg

    def kill(self) -> None:
        """Kills the process (if any); the next cell starts a fresh one."""
        if self.proc is not None:
            _kill_and_wait(self.proc)
            if self._wtransport is not None:
                self._wtransport.close()
            self.proc = None

    async def close(self) -> None:
        """Stops the sandbox process."""
        self.kill()

    def _send(self, frame: dict) -> None:
        self._wtransport.write(_encode(frame))

    async def run_cell(self, code: str, handler: ToolHandler) -> CellResult:
        """Runs one cell in this agent's namespace; returns its observation (never raises on cell behaviour)."""
        restarted = False
        if self.proc is None or self.proc.poll() is not None:
            restarted = self._cells > 0  # it died between cells: say so
            await self.start()
        self._cells += 1
        self._send({"t": "cell", "n": self._cells, "code": code if isinstance(code, str) else str(code)})
        loop = asyncio.get_running_loop()
        inbox = self._inbox
        budget = self.limits.wall_s + self.limits.grace_s  # wall seconds left, not counting awaited async tools
        started = loop.time()
        token = object()  # this cell's timeout marker (a stale marker of an earlier cell is ignored)
        timer = loop.call_at(started + budget, inbox.put, token)
        inflight: dict[Any, asyncio.Future] = {}
        try:
            while True:
                msg = await inbox.get()
                if isinstance(msg, tuple):  # an async tool call finished
                    cid, fut = msg
                    if inflight.pop(cid, None) is not None:
                        self._reply(cid, fut)
                        if not inflight:  # the wall clock runs again
                            started = loop.time()
                            timer = loop.call_at(started + budget, inbox.put, token)
                    continue
                if msg is token:
                    if inflight:
                        continue
                    return self._lost("killed", f"Error: the cell exceeded its wall-clock limit "
                                      f"({self.limits.wall_s:g} s) and did not stop; the sandbox was killed.")
                if not isinstance(msg, dict):
                    if msg is not None and not isinstance(msg, ValueError):
                        continue  # a stale timeout marker of an earlier cell
                    why = "crashed" if msg is None else "killed"
                    detail = "the sandbox process died" if msg is None else f"protocol violation ({msg})"
                    return self._lost(why, f"Error: {detail} while running the cell.")
                kind = msg.get("t")
                if kind == "done":
                    if msg.get("n") != self._cells:
                        continue  # a stale or forged frame of another cell
                    limit = msg.get("limit")
                    return CellResult(str(msg.get("out", ""))[: self.limits.output_chars + 200],
                                      str(msg.get("err", ""))[:4000], msg.get("ok") is True,
                                      limit if limit in ("cpu", "wall", "memory", "output") else None, restarted)
                if kind != "call" or not isinstance(msg.get("name"), str):
                    continue
                cid = msg.get("id")
                try:
                    args = decode_value(msg.get("a", {"l": []}))
                    kwargs = decode_value(msg.get("k", {"d": []}))
                    if not isinstance(args, list) or not isinstance(kwargs, dict) or \
                            not all(isinstance(k, str) for k in kwargs):
                        raise ValueError("malformed call")
                except (ValueError, RecursionError) as e:
                    self._send({"t": "ret", "id": cid, "err": f"bad tool call: {e}"})
                    continue
                if msg.get("async"):
                    if not inflight:  # stop the wall clock while awaiting (e.g. a sub-agent)
                        timer.cancel()
                        budget -= loop.time() - started
                    fut = asyncio.ensure_future(_call(handler, msg["name"], tuple(args), kwargs))
                    inflight[cid] = fut
                    fut.add_done_callback(lambda f, cid=cid: inbox.put((cid, f)))
                    continue
                try:
                    value = handler(msg["name"], tuple(args), kwargs)
                    if inspect.isawaitable(value):
                        value = await value
                    self._send_value(cid, value)
                except Exception as e:  # noqa: BLE001  (a handler bug becomes the cell's exception)
                    self._send({"t": "ret", "id": cid, "err": f"{type(e).__name__}: {e}"})
        finally:
            timer.cancel()
            for fut in inflight.values():
                fut.cancel()

    def _send_value(self, cid: Any, value: Any) -> None:
        try:
            self._send({"t": "ret", "id": cid, "v": value})
        except (TypeError, ValueError) as e:
            self._send({"t": "ret", "id": cid, "err": f"tool result not serialisable: {e}"})

    def _reply(self, cid: Any, fut: asyncio.Future) -> None:
        if self.proc is None or fut.cancelled():
            return
        exc = fut.exception()
        if exc is not None:
            self._send({"t": "ret", "id": cid, "err": f"{type(exc).__name__}: {exc}"})
        else:
            self._send_value(cid, fut.result())

    def _lost(self, why: str, text: str) -> CellResult:
        self.kill()
        self._cells = 0  # this observation tells the agent; the next cell starts fresh without repeating it
        return CellResult("", text + " Variables from earlier cells were lost; the next cell starts in a fresh "
                          "namespace.", ok=False, limit=why, restarted=True)


async def _call(handler: ToolHandler, name: str, args: tuple, kwargs: dict) -> Any:
    value = handler(name, args, kwargs)
    if inspect.isawaitable(value):
        value = await value
    return value


class SandboxPool:
    """Pre-started sandboxes of one configuration, so a new agent's first cell need not wait ~0.2 s for a
    process start. ``acquire()`` returns a started :class:`Sandbox` owned by the caller from then on (one per
    agent; close it when the agent's tree is dropped) and starts a replacement in the background."""

    def __init__(self, sync_tools=(), async_tools=(), limits: Limits = Limits(), spares: int = 2):
        self.args = (tuple(sync_tools), tuple(async_tools), limits)
        self.spares = spares
        self._ready: list[Sandbox] = []
        self._starting: set[asyncio.Task] = set()

    async def _start_one(self) -> None:
        sb = Sandbox(*self.args)
        try:
            await sb.start()
        except Exception:  # noqa: BLE001  (a failed spare is just not added; acquire() starts its own)
            sb.kill()
            return
        self._ready.append(sb)

    def _refill(self) -> None:
        while len(self._ready) + len(self._starting) < self.spares:
            task = asyncio.ensure_future(self._start_one())
            self._starting.add(task)
            task.add_done_callback(self._starting.discard)

    async def acquire(self) -> Sandbox:
        """Returns a started sandbox (a spare if one is ready)."""
        while self._ready:
            sb = self._ready.pop()
            if sb.proc is not None and sb.proc.poll() is None:
                self._refill()
                return sb
        sb = Sandbox(*self.args)
        await sb.start()
        self._refill()
        return sb

    async def close(self) -> None:
        """Stops the spares (acquired sandboxes belong to their users)."""
        for task in list(self._starting):
            task.cancel()
        for sb in self._ready:
            sb.kill()
        self._ready.clear()
