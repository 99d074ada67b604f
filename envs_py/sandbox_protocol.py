"""The host's side of the sandbox wire: frames are 4-byte lengths + JSON, and everything a sandbox sends is untrusted.

The host decodes with ``json`` only, then checks each frame against a strict shape (frame type, key set, value
types, integer ids) and decodes tagged values with caps on size, nesting, entries and dict-key types, so decoding
takes bounded time: integer dict keys are limited to |k| < 2**53 and tuple keys are refused, since Python's hashes
of large ints and of tuples can be made to collide at will (a few MB of such keys stalled the event loop for
seconds). The inbox is bounded in frames and in bytes, and holds frames as the bytes that arrived: each is decoded
when the host reads it (``decode_frame``), so frames piling up while the host is busy cost their wire size, not the
~20x of their decoded objects (24 frames of 1 MiB of empty lists had raised host RSS by 557 MB; issue #55). Any
violation is reported as a :class:`Violation` value, never raised into the host's loop (issue #49).
"""

from __future__ import annotations

import asyncio
import collections
import json
import math
import struct
from typing import Any, Callable

HDR = struct.Struct("<I")
MAX_FRAME = 1 << 20  # bytes of one frame from a sandbox (a cell's output is capped far below)
MAX_ENTRIES = 100_000  # list items + dict entries in one decoded frame
MAX_DEPTH = 64
MAX_INBOX = 256  # frames from a sandbox waiting to be handled
MAX_INBOX_BYTES = 4 << 20  # their bytes (a legitimate sandbox has one call, or its async calls, waiting at most)
# Entries in one tool call's arguments: a TextCraft world has ~2,000 item names, and a reply is built per entry, so
# this bounds the reply's cost on the host's loop (get_info of 76,000 names took 0.67 s; at the cap ~35 ms).
MAX_CALL_ENTRIES = 4096
MAX_ID = 1 << 53
LIMITS = ("cpu", "wall", "memory", "output")
# Every frame type a sandbox may send, with its keys and their checks.
_INT = (lambda v: type(v) is int and 0 <= v < MAX_ID)
_STR = (lambda v: type(v) is str)
SHAPES: dict[str, dict[str, Callable[[Any], bool]]] = {
    "call": {"t": _STR, "id": _INT, "name": lambda v: type(v) is str and 0 < len(v) <= 100,
             "a": lambda v: type(v) is dict, "k": lambda v: type(v) is dict, "async": lambda v: type(v) is bool},
    "done": {"t": _STR, "n": _INT, "out": lambda v: type(v) is str, "err": lambda v: type(v) is str,
             "ok": lambda v: type(v) is bool, "limit": lambda v: v is None or v in LIMITS},
    "jail": {"t": _STR, "pid": lambda v: type(v) is int and 0 < v < 1 << 31},
    "refused": {"t": _STR, "why": lambda v: type(v) is str},
    "ready": {"t": _STR, "uid_dropped": lambda v: type(v) is bool,
              "seccomp": lambda v: type(v) is bool, "uid": _INT, "layers": lambda v: type(v) is dict},
}
OPTIONAL = {"done": {"limit"}}


class Violation:
    """A frame that broke the protocol (or the pipe closing: ``closed``); the sandbox is killed for it."""

    def __init__(self, why: str, closed: bool = False):
        self.why, self.closed = why, closed

    def __repr__(self) -> str:
        return f"Violation({self.why!r})"


def encode(frame: dict) -> bytes:
    """Returns ``frame`` as wire bytes."""
    body = json.dumps(frame, separators=(",", ":")).encode()
    return HDR.pack(len(body)) + body


def check_frame(msg: Any, allowed: tuple[str, ...]) -> dict:
    """Returns ``msg`` if it is a frame of one of the ``allowed`` types with exactly its keys, each of the right
    type; raises ValueError otherwise."""
    if type(msg) is not dict or msg.get("t") not in allowed:
        raise ValueError(f"unexpected frame {str(msg.get('t') if type(msg) is dict else type(msg).__name__)[:40]!r}")
    shape = SHAPES[msg["t"]]
    keys = set(msg)
    if not keys <= set(shape) or not set(shape) - OPTIONAL.get(msg["t"], set()) <= keys:
        raise ValueError(f"a {msg['t']!r} frame with keys {sorted(keys)[:10]}")
    for k, ok in shape.items():
        if k in msg and not ok(msg[k]):
            raise ValueError(f"a {msg['t']!r} frame whose {k!r} is malformed")
    return msg


def decode_frame(body: bytes) -> dict:
    """Returns the JSON object a frame's bytes hold; raises ValueError if they hold none."""
    try:
        msg = json.loads(body)
    except (ValueError, RecursionError) as e:
        raise ValueError(f"undecodable frame: {str(e)[:80]}") from None
    if type(msg) is not dict:
        raise ValueError("a frame that is not an object")
    return msg


def _key_ok(k: Any) -> bool:
    t = type(k)
    return (t is str or k is None or t is bool or (t is int and -MAX_ID < k < MAX_ID)
            or (t is float and math.isfinite(k) and abs(k) < MAX_ID))


def decode_value(x: Any, depth: int = 0, budget: list | None = None) -> Any:
    """Returns the Python value of a tagged child value (tuples, lists, dicts); unknown objects become a
    placeholder string. Raises ValueError on malformed input, nesting past 64, more than 100,000 entries (or the cap
    ``budget`` names: [entries left, cap]), or a dict key that is not a str, bool, None, finite float or int under
    2**53 in size."""
    budget = [MAX_ENTRIES, MAX_ENTRIES] if budget is None else budget  # [entries left, the cap]
    if depth > MAX_DEPTH:
        raise ValueError("value nested too deeply")
    if x is None or type(x) in (bool, int, float, str):
        return x
    if type(x) is dict and len(x) == 1:
        (tag, v), = x.items()
        if tag in ("l", "t", "d") and type(v) is list:
            budget[0] -= len(v)
            if budget[0] < 0:
                raise ValueError(f"more than {budget[-1]} entries")
        if tag == "l" and type(v) is list:
            return [decode_value(e, depth + 1, budget) for e in v]
        if tag == "t" and type(v) is list:
            return tuple(decode_value(e, depth + 1, budget) for e in v)
        if tag == "d" and type(v) is list:
            out = {}
            for pair in v:
                if type(pair) is not list or len(pair) != 2:
                    raise ValueError("bad dict entry")
                k = decode_value(pair[0], depth + 1, budget)
                if not _key_ok(k):
                    raise ValueError(f"dict key of type {type(k).__name__} not accepted")
                out[k] = decode_value(pair[1], depth + 1, budget)
            return out
        if tag == "o" and type(v) is str:
            return f"<{v[:60]} object>"
    raise ValueError("malformed value")


class Inbox:
    """Frames from the sandbox (their undecoded bytes), finished async tool calls and timer expiries, in arrival
    order. ``frames`` and ``size`` count the sandbox's frames waiting and their bytes (bounded by the reader)."""

    def __init__(self):
        self.items: collections.deque = collections.deque()
        self.waiter: asyncio.Future | None = None
        self.frames = 0
        self.size = 0

    def put(self, item: Any) -> None:
        if type(item) is bytes:
            self.frames += 1
            self.size += len(item)
        self.items.append(item)
        if self.waiter is not None and not self.waiter.done():
            self.waiter.set_result(None)

    async def get(self) -> Any:
        while not self.items:
            self.waiter = asyncio.get_running_loop().create_future()
            await self.waiter
            self.waiter = None
        item = self.items.popleft()
        if type(item) is bytes:
            self.frames -= 1
            self.size -= len(item)
        return item

    def clear(self) -> int:
        """Drops everything waiting (a cell's boundary); returns how many of it were the sandbox's frames."""
        frames = self.frames
        self.items.clear()
        self.frames = self.size = 0
        return frames


class FrameReader(asyncio.Protocol):
    """Splits the sandbox's stdout into frames, queued undecoded. ``accepting()`` says whether a frame may arrive now
    (a cell runs, or the sandbox starts); a frame at any other time, an oversized one, or a full inbox (frames or
    bytes) is a :class:`Violation`, after which nothing more is read, and ``on_violation`` is called at once."""

    def __init__(self, inbox: Inbox, accepting: Callable[[], bool], on_violation: Callable[[], None]):
        self.inbox, self.accepting, self.on_violation = inbox, accepting, on_violation
        self.buf, self.broken, self.transport = bytearray(), False, None

    def connection_made(self, transport) -> None:
        self.transport = transport

    def _violate(self, why: str) -> None:
        self.broken = True
        self.buf.clear()
        self.inbox.put(Violation(why))
        self.on_violation()

    def data_received(self, data: bytes) -> None:
        if self.broken:
            return
        if not self.accepting():
            return self._violate("the sandbox wrote while no cell was running")
        self.buf += data
        while len(self.buf) >= 4:
            (n,) = HDR.unpack_from(self.buf)
            if n > MAX_FRAME:
                return self._violate(f"oversized frame ({n} bytes)")
            if len(self.buf) < 4 + n:
                return
            if self.inbox.frames >= MAX_INBOX or self.inbox.size + n > MAX_INBOX_BYTES:
                return self._violate(f"more than {MAX_INBOX} frames or {MAX_INBOX_BYTES >> 20} MiB waiting")
            body = bytes(self.buf[4:4 + n])
            del self.buf[:4 + n]
            self.inbox.put(body)

    def connection_lost(self, exc) -> None:
        self.inbox.put(Violation("the sandbox process died", closed=True))
