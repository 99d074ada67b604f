"""What the host allows one cell, and its serving of the cell's frames (issue #55; used by ``sandbox.py``).

``serve`` reads one cell's frames from a sandbox's inbox, decoding each as it is read, until the cell's ``done``:
sync calls are answered inline, async calls (only for the tools declared async, at most ``Limits.max_inflight`` in
flight) run as tasks beside it. Every well-shaped frame the sandbox's own code would never send now is a violation:
a call of a name that is not a tool, an ``async`` flag that is not the tool's, any frame while a synchronous call is
pending, and any frame after ``done``. The host's budgets (``sandbox_budget.py``) are checked by a timer: the wall
clock, paused only while one of the host's async tools is in flight and at most ``Limits.pause_cap_s`` per cell, and
the CPU of the sandbox process plus the host's own time serving the cell. A call's arguments hold at most 4,096
entries and its reply at most 4 MiB, so no reply costs the host's loop more than a few tens of ms.
"""

from __future__ import annotations

import asyncio
import collections
import dataclasses
import inspect
import logging
from typing import TYPE_CHECKING, Any, Callable

from envs_py.sandbox_budget import CellBudget, thread_cpu
from envs_py.sandbox_protocol import MAX_CALL_ENTRIES, Violation, check_frame, decode_frame, decode_value, encode

if TYPE_CHECKING:
    from envs_py.sandbox import Sandbox

ToolHandler = Callable[[str, tuple, dict], Any]
MAX_WRITE_BUFFER = 16 << 20  # tool replies the sandbox leaves unread
MAX_REPLY = 4 << 20  # bytes of one tool reply
VIOLATIONS: collections.Counter = collections.Counter()  # kind -> cells of this process the host failed for it
log = logging.getLogger("envs_py.sandbox")


@dataclasses.dataclass(frozen=True)
class Limits:
    """Per-cell limits: CPU and wall seconds, address space, printed characters, host grace before a kill (in wall
    and in CPU seconds), the most wall seconds of one cell that waits on async tools (sub-agents) may leave uncounted,
    and the most async calls in flight at once."""

    cpu_s: float = 5.0
    wall_s: float = 10.0
    memory_mb: int = 1024
    output_chars: int = 20000
    grace_s: float = 2.0
    lifetime_cpu_s: int = 3600
    pause_cap_s: float = 1800.0
    max_inflight: int = 32


@dataclasses.dataclass(frozen=True)
class CellResult:
    """One cell's observation: printed output (incl. last-expression value and traceback), error text, whether
    it ran cleanly, the limit it broke (``cpu``/``wall``/``memory``/``output``/``killed``/``crashed``) if any,
    whether the sandbox process was replaced (namespace lost), and why the host failed the cell, if it did
    (``wall``/``cpu``: a host budget; ``protocol``; ``crashed``; ``cancelled``)."""

    output: str
    error: str = ""
    ok: bool = True
    limit: str | None = None
    restarted: bool = False
    violation: str | None = None


def count(kind: str, why: str) -> None:
    """Counts and logs one cell the host failed (or stopped) for ``kind``."""
    VIOLATIONS[kind] += 1
    log.warning("sandbox cell failed by the host (%s): %s", kind, why[:200])


async def serve(sb: "Sandbox", handler: ToolHandler, restarted: bool) -> CellResult:
    """Returns the observation of the cell ``sb`` was just sent, serving its calls with ``handler``."""
    loop = asyncio.get_running_loop()
    inbox, lim = sb._inbox, sb.limits
    budget = CellBudget(lim.wall_s + lim.grace_s, lim.cpu_s + lim.grace_s, lim.pause_cap_s, sb.pid, loop.time())
    tick = object()  # this cell's check marker; its call completions are tagged with it too
    timer = [loop.call_later(min(budget.wall_s, budget.cpu_s / 2), inbox.put, tick)]
    inflight: dict[int, asyncio.Future] = {}  # async calls of this cell
    sync_call: tuple | None = None  # (id, future) of a sync call whose handler is awaited

    def rearm(delay: float) -> None:
        timer[0].cancel()
        timer[0] = loop.call_later(delay, inbox.put, tick)

    def track(cid: int, fut: asyncio.Future) -> None:
        fut.add_done_callback(lambda f: inbox.put((tick, cid, f)))

    try:
        while True:
            item = await inbox.get()
            if type(item) is tuple:  # a call's handler finished
                tag, cid, fut = item
                if tag is not tick:
                    continue
                if sync_call is not None and sync_call[1] is fut:
                    sync_call = None
                    _reply(sb, cid, fut, budget)
                elif inflight.get(cid) is fut:
                    del inflight[cid]
                    _reply(sb, cid, fut, budget)
                    if not inflight:  # the wall clock runs again
                        budget.resume(loop.time())
                        rearm(0)
                continue
            if item is tick:
                over, delay = budget.check(loop.time())
                if over == "wall":
                    return sb._violation("wall", f"the cell exceeded its wall-clock limit ({lim.wall_s:g} s) "
                                           "and did not stop; the sandbox was killed")
                if over == "cpu":
                    return sb._violation("cpu", f"the cell exceeded its CPU time limit ({lim.cpu_s:g} s) "
                                           "and did not stop; the sandbox was killed")
                rearm(delay)
                continue
            if isinstance(item, Violation):
                if item.closed:
                    return sb._violation("crashed", item.why)
                return sb._violation("protocol", f"protocol violation ({item.why})")
            if type(item) is not bytes:
                continue
            if sync_call is not None:  # not even decoded: the child's own code sends nothing while it waits
                return sb._violation("protocol", "protocol violation (a frame while a synchronous call is pending)")
            t0 = thread_cpu()
            try:
                msg = check_frame(decode_frame(item), ("call", "done"))
                _check_frame(sb, msg, inflight)
            except ValueError as e:
                return sb._violation("protocol", f"protocol violation ({e})")
            if msg["t"] == "done":
                if inbox.frames:
                    return sb._violation("protocol", "protocol violation (a frame after the cell's done)")
                return CellResult(msg["out"][: lim.output_chars + 200], msg["err"][:4000], msg["ok"],
                                  msg.get("limit"), restarted)
            if sb._wtransport is not None and sb._wtransport.get_write_buffer_size() > MAX_WRITE_BUFFER:
                return sb._violation("protocol", "protocol violation (tool replies left unread)")
            cid, name = msg["id"], msg["name"]
            try:
                budget_entries = [MAX_CALL_ENTRIES, MAX_CALL_ENTRIES]
                args = decode_value(msg["a"], budget=budget_entries)
                kwargs = decode_value(msg["k"], budget=budget_entries)
                if not isinstance(args, list) or not isinstance(kwargs, dict) or \
                        not all(isinstance(k, str) for k in kwargs):
                    raise ValueError("malformed call")
            except (ValueError, RecursionError) as e:
                sb._send({"t": "ret", "id": cid, "err": f"bad tool call: {e}"})
                budget.charge(thread_cpu() - t0)
                continue
            if msg["async"]:
                if len(inflight) >= lim.max_inflight:
                    sb._send({"t": "ret", "id": cid, "err": f"too many tool calls in flight (at most "
                                f"{lim.max_inflight}); await some before starting more"})
                else:
                    if not inflight:  # stop the wall clock while awaiting (e.g. a sub-agent)
                        budget.pause(loop.time())
                    inflight[cid] = fut = asyncio.ensure_future(_call(handler, name, tuple(args), kwargs))
                    track(cid, fut)
                budget.charge(thread_cpu() - t0)
                continue
            try:
                value = handler(name, tuple(args), kwargs)
                if inspect.isawaitable(value):  # awaited beside the inbox: the child sends nothing meanwhile
                    sync_call = (cid, asyncio.ensure_future(value))
                    track(cid, sync_call[1])
                else:
                    _send_value(sb, cid, value)
            except Exception as e:  # noqa: BLE001  (a handler bug becomes the cell's exception)
                sb._send({"t": "ret", "id": cid, "err": f"{type(e).__name__}: {e}"})
            budget.charge(thread_cpu() - t0)
    finally:
        timer[0].cancel()
        for fut in inflight.values():
            fut.cancel()
        if sync_call is not None:
            sync_call[1].cancel()


def _check_frame(sb: "Sandbox", msg: dict, inflight: dict) -> None:
    """Raises ValueError if a well-shaped frame is one the sandbox's own code would never send now."""
    if msg["t"] == "done":
        if msg["n"] != sb._cells:
            raise ValueError("a done frame for another cell")
        return
    name = msg["name"]
    if name not in sb.sync_tools and name not in sb.async_tools:
        raise ValueError(f"a call of {name[:40]!r}, which is not a tool")
    if msg["async"] != (name in sb.async_tools):
        raise ValueError(f"a call of {name!r} whose async flag is not its tool's")
    if msg["id"] in inflight:
        raise ValueError("a call id already in flight")


def _send_value(sb: "Sandbox", cid: Any, value: Any) -> None:
    try:
        data = encode({"t": "ret", "id": cid, "v": value})
    except (TypeError, ValueError) as e:
        return sb._send({"t": "ret", "id": cid, "err": f"tool result not serialisable: {e}"})
    if len(data) > MAX_REPLY:
        return sb._send({"t": "ret", "id": cid, "err": f"tool result too large ({len(data)} bytes; at most "
                         f"{MAX_REPLY}): ask for less at once"})
    if sb._wtransport is not None and not sb._wtransport.is_closing():
        sb._wtransport.write(data)


def _reply(sb: "Sandbox", cid: Any, fut: asyncio.Future, budget: CellBudget) -> None:
    if sb.proc is None or fut.cancelled():
        return
    t0 = thread_cpu()
    exc = fut.exception()
    if exc is not None:
        sb._send({"t": "ret", "id": cid, "err": f"{type(exc).__name__}: {exc}"})
    else:
        _send_value(sb, cid, fut.result())
    budget.charge(thread_cpu() - t0)


async def _call(handler: ToolHandler, name: str, args: tuple, kwargs: dict) -> Any:
    value = handler(name, args, kwargs)
    if inspect.isawaitable(value):
        value = await value
    return value
