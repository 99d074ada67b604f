"""A cap on the live sandboxes of one host process, with back-pressure (issue #55): a sandbox takes a slot before its
process is started and gives it back when the process is killed; a start past the cap waits for a slot, first come
first served, and never fails for it.

Each sandbox is a process of ~10 MB and a pipe pair, and agents launch agents: without a cap a policy that fans out
grows the host without bound. The cap is ``SERA_SANDBOX_MAX_LIVE`` (default 512), or ``set_max_live``. It should
exceed what the host's trees hold at once in normal operation: a parent whose cell awaits a sub-agent keeps its slot
while the sub-agent's sandbox waits for one, so a cap far below that slows the trees down (each parent's wait is
then bounded only by its pause cap and the tree's timeout).
"""

from __future__ import annotations

import asyncio
import collections
import os


class LiveSlots:
    """Counts live sandboxes against ``cap``; ``acquire()`` waits while they are all taken."""

    def __init__(self, cap: int):
        self.cap = cap
        self.live = 0
        self.peak = 0
        self.waits = 0  # starts that had to wait for a slot (back-pressure applied)
        self._waiters: collections.deque[asyncio.Future] = collections.deque()

    async def acquire(self) -> None:
        """Returns once this caller holds a slot (waiting for one if all are taken)."""
        if self.live < self.cap and not self._waiters:
            self.live += 1
            self.peak = max(self.peak, self.live)
            return
        self.waits += 1
        fut = asyncio.get_running_loop().create_future()
        self._waiters.append(fut)
        try:
            await fut  # a release hands its slot over: ``live`` is unchanged
        except asyncio.CancelledError:
            if fut.done() and not fut.cancelled():
                self.release()  # the slot was handed over as this wait was cancelled: pass it on
            else:
                try:
                    self._waiters.remove(fut)
                except ValueError:
                    pass
            raise

    def release(self) -> None:
        """Gives a slot back: to the first live waiter, else to the pool."""
        while self._waiters:
            fut = self._waiters.popleft()
            if fut.done():
                continue
            try:
                fut.set_result(None)
                return
            except RuntimeError:  # its event loop is closed (a finished asyncio.run): that waiter is gone
                continue
        self.live = max(0, self.live - 1)


SLOTS = LiveSlots(int(os.environ.get("SERA_SANDBOX_MAX_LIVE", "512")))


def set_max_live(cap: int) -> None:
    """Sets this process's cap on live sandboxes (waiters are let in as slots are released)."""
    SLOTS.cap = cap
    while SLOTS._waiters and SLOTS.live < SLOTS.cap:
        SLOTS.live += 1
        SLOTS.release()  # to the first live waiter (or back, if none is left)
