"""A sandbox for model-written Python cells: one persistent, locked-down process per agent (issue #49: a
kernel-enforced boundary, as root and as an ordinary user).

Host side (any asyncio process, e.g. an env worker): :class:`Sandbox` runs ``sandbox_child.py`` under
``python -I -S`` with an empty environment, or (on Linux, the default) forks it from a :class:`Zygote` that has done
the pre-imports once. Before any cell the process enters these layers (``sandbox_jail.py``):

* its own PID, network, mount, IPC and UTS namespaces (and a user namespace when the host is not root): no other
  process is visible, so none can be signalled, traced or re-scheduled; no network, not even loopback; the root is
  an empty read-only tmpfs, so no file of the host's or the user's is reachable and nothing is writable;
* uid 65534 and no capabilities; its own session; it dies with its host (parent-death signals down a chain, and as
  its namespace's init it takes the namespace with it);
* rlimits: no new processes (NPROC 0), no file writes (FSIZE 0), no new descriptors, an address-space cap, no core
  files, a lifetime CPU cap;
* a seccomp allowlist built with libseccomp (``pyseccomp``): only what a running cell needs, with argument filters
  (``fcntl`` cannot set O_ASYNC, F_SETOWN or F_SETSIG); everything else fails with EPERM;
* then, inside the untrusted process (so determined code can switch them off; the tests do): an audit hook and a
  cell namespace without open/eval/exec/compile and with whitelisted imports, for clear early error messages.

Where the kernel refuses the namespaces (no user namespaces and not root) or libseccomp is missing, the sandbox
refuses to start, with :class:`SandboxRefused` naming what is missing; ``SERA_SANDBOX_UNISOLATED=1`` runs without
them, with a warning on every run. The first sandbox of a host process prints its layer report.

The host treats the wire as hostile (``sandbox_protocol.py``): strict frame shapes, capped sizes and entries,
bounded decoding time, an inbox bounded in frames and bytes whose frames are decoded when read; a frame while no cell
runs, or after the cell's ``done``, kills the sandbox, which is stopped (SIGSTOP) between cells; and whatever the
sandbox sends, ``run_cell`` returns an observation, never raises. The child holds no world state: every tool call,
``launch_subagent`` included, is an RPC answered by the host's handler, which validates it. Per cell the child
enforces CPU and wall-clock limits (the wall clock paused while awaiting async tools such as sub-agents) and an output
cap. The host bounds every cell whatever it does inside (issue #55; ``sandbox_budget.py``): its wall clock, paused
only while one of the host's async tools is in flight and at most ``Limits.pause_cap_s`` per cell; its CPU, the
sandbox process's own times plus the host's time serving its calls; the ``async`` flag of a call must be its tool's,
and at most ``Limits.max_inflight`` async calls are in flight; a call's arguments hold at most 4,096 entries and a
reply is at most 4 MiB. Past a budget, on a crash or a protocol violation, or when ``run_cell`` is cancelled (a tree's
timeout), the host kills the process and starts a fresh one for the next cell: the observation says the namespace
was lost, and ``CellResult.violation`` says why (each counted in ``VIOLATIONS`` and logged). Live sandboxes per host
process are capped (``sandbox_slots.py``): a start past the cap waits for a slot.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import os
import subprocess
import sys
import threading

from envs_py.sandbox_cell import VIOLATIONS, CellResult, Limits, ToolHandler, count, serve
from envs_py.sandbox_process import CHILD, UNISOLATED_ENV, Forked, SandboxProcess, Zygote, child_options
from envs_py.sandbox_protocol import (MAX_FRAME, FrameReader, Inbox, Violation, check_frame, decode_frame,
                                      decode_value, encode)
from envs_py.sandbox_slots import SLOTS, set_max_live

__all__ = ["CellResult", "Forked", "Limits", "MAX_FRAME", "Sandbox", "SandboxPool", "SandboxRefused", "VIOLATIONS",
           "Zygote", "decode_value", "layer_report", "set_max_live"]
_reported = threading.Lock()
_REPORTED: set[int] = set()  # host pids that printed their layer report


class SandboxRefused(RuntimeError):
    """The machine cannot give a sandbox its isolation layers (the message says which are missing)."""


def layer_report(info: dict) -> str:
    """Returns a one-line description of a started sandbox's layers (from its ready message)."""
    lay = info.get("layers", {})
    ns = ", ".join(lay.get("namespaces", [])) or "none"
    rl = " ".join(f"{k.lower()}={v}" for k, v in lay.get("rlimits", {}).items())
    return (f"uid {lay.get('uid')} (on the host: {lay.get('host_uid')}); namespaces: {ns}; root: {lay.get('root')}; "
            f"capabilities: {lay.get('capabilities')}; seccomp: {lay.get('seccomp')}; rlimits: {rl}")


def _announce(info: dict) -> None:
    """Prints the layer report once per host process, and the opt-out warning on every run that uses it."""
    with _reported:
        if os.getpid() in _REPORTED:
            return
        _REPORTED.add(os.getpid())
    refused = info.get("layers", {}).get("refused")
    if refused or not info.get("seccomp"):
        print(f"WARNING: sera sandbox runs model-written code WITHOUT ISOLATION ({UNISOLATED_ENV}=1): "
              f"{refused or 'no seccomp allowlist'}. A cell can reach this user's processes and files.",
              file=sys.stderr, flush=True)
    print(f"sera sandbox layers: {layer_report(info)}", file=sys.stderr, flush=True)


class Sandbox:
    """One agent's persistent sandbox process. ``await run_cell(code, handler)`` -> :class:`CellResult`.

    ``handler(name, args, kwargs)`` answers tool calls (sync or async function); its return value must be
    JSON-serialisable. Tools named in ``async_tools`` are coroutines in the cell (``await launch_subagent(...)``);
    time spent awaiting them counts toward no wall-clock limit, up to ``limits.pause_cap_s`` per cell.
    """

    def __init__(self, sync_tools=(), async_tools=(), limits: Limits = Limits(),
                 forbidden_attrs=("asyncio.all_tasks", "asyncio.current_task"), zygote: bool = True):
        self.config = {"sync": list(sync_tools), "async": list(async_tools), "forbidden": list(forbidden_attrs),
                       "cpu_s": limits.cpu_s, "wall_s": limits.wall_s, "memory": limits.memory_mb << 20,
                       "out": limits.output_chars, "life_cpu": limits.lifetime_cpu_s}
        self.limits = limits
        self.sync_tools, self.async_tools = frozenset(sync_tools), frozenset(async_tools)
        self.zygote = zygote and Zygote.available()
        self.proc: SandboxProcess | None = None
        self.info: dict = {}
        self._inbox: Inbox | None = None
        self._wtransport = None
        self._rtransport = None
        self._cells = 0
        self._slot = False  # whether this sandbox holds one of the host's live-sandbox slots
        self._state = "idle"  # "starting" | "running" (frames expected) | "idle" (stopped; a frame kills it)

    @property
    def pid(self) -> int | None:
        """Returns the sandbox process id (the sandbox proper, inside its namespaces; None before start)."""
        return self.proc.pid if self.proc is not None else None

    async def start(self) -> dict:
        """Starts the process if needed (waiting for a live-sandbox slot if the host has none free) and waits for it
        to be locked down; returns its ready message (with its ``layers``). Raises SandboxRefused where the machine
        cannot isolate it, RuntimeError if it fails to start."""
        if self.proc is not None and self.proc.poll() is None:
            return self.info
        if not self._slot:
            await SLOTS.acquire()
            self._slot = True
        try:
            return await self._start()
        except BaseException:
            self.kill()  # gives the slot back
            raise

    async def _start(self) -> dict:
        loop = asyncio.get_running_loop()
        if self.zygote:
            try:
                outer, stdin, stdout = Zygote.shared().fork(self.config)
            except OSError:  # the zygote died since it was last checked: start a new one, once
                Zygote.discard()
                outer, stdin, stdout = Zygote.shared().fork(self.config)
            stdin, stdout = os.fdopen(stdin, "wb", buffering=0), os.fdopen(stdout, "rb", buffering=0)
        else:
            outer = subprocess.Popen(
                [sys.executable, "-I", "-S", "-B", CHILD, json.dumps({**self.config, **child_options()})],
                stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, env={}, cwd="/",
                close_fds=True)
            stdin, stdout = outer.stdin, outer.stdout
        self.proc = proc = SandboxProcess(outer)
        self._inbox = inbox = Inbox()
        self._state = "starting"
        self._rtransport, _ = await loop.connect_read_pipe(
            lambda: FrameReader(inbox, lambda: self._state != "idle", self._between_cells), stdout)
        self._wtransport, _ = await loop.connect_write_pipe(asyncio.BaseProtocol, stdin)
        try:
            msg = await asyncio.wait_for(self._handshake(proc, inbox), timeout=30)
        except (asyncio.TimeoutError, ValueError) as e:
            raise RuntimeError(f"sandbox process failed to start: {e}") from None
        self.info = msg
        self._cells = 0
        self._state = "idle"
        proc.stop()
        _announce(msg)
        return msg

    async def _handshake(self, proc: SandboxProcess, inbox: Inbox) -> dict:
        """Returns the ready message, having adopted the sandbox proper named by its keeper's jail frame."""
        while True:
            item = await inbox.get()
            if isinstance(item, Violation):
                raise ValueError(item.why)
            if type(item) is not bytes:
                continue
            msg = check_frame(decode_frame(item), ("jail", "refused", "ready"))
            if msg["t"] == "refused":
                raise SandboxRefused(f"the sandbox refuses to run model-written code here: {msg['why']}. Set "
                                     f"{UNISOLATED_ENV}=1 to run it without these layers at your own risk.")
            if msg["t"] == "jail":
                if proc.inner is not None or not proc.adopt(msg["pid"]):
                    raise ValueError("the sandbox's keeper named no live process")
                continue
            if msg["layers"].get("namespaces") and proc.inner is None:
                raise ValueError("a sandbox in namespaces whose keeper never named it")
            return msg

    def _between_cells(self) -> None:
        """A frame arrived while no cell runs (or the reader saw a violation): the sandbox is killed now."""
        if self._state == "idle" and self.proc is not None:
            count("protocol", "a frame while no cell was running (the next cell starts in a fresh namespace)")
            self.kill()

    def kill(self) -> None:
        """Kills the process (if any) and gives its live-sandbox slot back; the next cell starts a fresh one."""
        if self.proc is not None:
            proc, self.proc = self.proc, None
            proc.kill()
            try:
                proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                pass
            for t in (self._wtransport, self._rtransport):
                if t is not None:
                    t.close()
        if self._slot:
            self._slot = False
            SLOTS.release()
        self._state = "idle"

    async def close(self) -> None:
        """Stops the sandbox process."""
        self.kill()

    def _send(self, frame: dict) -> None:
        if self._wtransport is None or self._wtransport.is_closing():
            return
        self._wtransport.write(encode(frame))

    async def run_cell(self, code: str, handler: ToolHandler) -> CellResult:
        """Runs one cell in this agent's namespace; returns its observation (never raises on cell behaviour,
        whatever the sandbox sends; SandboxRefused if a sandbox cannot be started here). Cancelled (a tree's
        timeout), it kills the sandbox before it re-raises: nothing of the cell runs on."""
        restarted = False
        if self.proc is None or self.proc.poll() is not None:
            restarted = self._cells > 0  # it died between cells (or was killed for writing then): say so
            self.kill()
            await self.start()
        self._cells += 1
        self._inbox.clear()  # nothing of an earlier cell (a stale timer, a late call's end) reaches this one
        self._state = "running"
        self.proc.cont()
        self._send({"t": "cell", "n": self._cells, "code": code if isinstance(code, str) else str(code)})
        try:
            result = await serve(self, handler, restarted)
        except asyncio.CancelledError:
            count("cancelled", "run_cell cancelled; its sandbox is stopped")
            self.kill()
            raise
        except Exception as e:  # noqa: BLE001  (the host never raises on what a sandbox sends)
            result = self._violation("protocol", f"protocol violation ({type(e).__name__})")
        if self.proc is not None:
            self._state = "idle"
            self.proc.stop()
            self._inbox.clear()
        return result

    def _violation(self, kind: str, why: str) -> CellResult:
        """Returns the observation of a cell the host failed (``kind``: see CellResult), counted and logged."""
        count(kind, why)
        result = self._lost("crashed" if kind == "crashed" else "killed", f"Error: {why} while running the cell."
                            if kind in ("protocol", "crashed") else f"Error: {why}.")
        return dataclasses.replace(result, violation=kind)

    def _lost(self, why: str, text: str) -> CellResult:
        self.kill()
        self._cells = 0  # this observation tells the agent; the next cell starts fresh without repeating it
        return CellResult("", text + " Variables from earlier cells were lost; the next cell starts in a fresh "
                          "namespace.", ok=False, limit=why, restarted=True)


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
