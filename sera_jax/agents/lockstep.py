"""Lockstep ticks for siblings launched together, in deterministic mode.

Every member takes one turn per tick: at the start of tick k all members observe, then generate concurrently (the
engine batches them), then act one at a time in the fixed member order (no act before every member has observed).
A member leaves at a deterministic point: its exit (final observation and labels) is taken in its own slot of the
tick after its last turn. The world therefore sees the
same sequence of reads and writes on every replay, while siblings still interleave as they do when run
concurrently. A member's nested delegation runs to completion inside its slot.
"""

from __future__ import annotations

import asyncio


class Lockstep:
    """Tick gate of one sibling group (member ids in their fixed order)."""

    def __init__(self, member_ids: list[str]):
        self.order = list(member_ids)
        self.active = list(member_ids)
        self.tick = 0
        self.observed: set[str] = set()
        self.finished: set[str] = set()
        self._changed = asyncio.Event()

    async def _until(self, ready) -> None:
        while not ready():
            changed = self._changed
            await changed.wait()

    def _signal(self) -> None:
        # Wake every waiter once; each re-checks its own condition (a fresh event for the next change).
        changed, self._changed = self._changed, asyncio.Event()
        changed.set()

    async def begin(self, member: str, tick: int) -> None:
        """Waits until tick ``tick`` (the member's count of finished ticks) has started."""
        await self._until(lambda: self.tick >= tick)

    def observe_done(self, member: str) -> None:
        """Marks that ``member`` has read the world for the current tick (no act of the tick may precede it)."""
        self.observed.add(member)
        self._signal()

    async def slot(self, member: str) -> None:
        """Waits until every active member has observed this tick and every one ahead of ``member`` is done."""
        await self._until(lambda: all(m in self.observed for m in self.active)
                          and all(m in self.finished for m in self._ahead(member)))

    def done(self, member: str) -> None:
        """Marks ``member``'s turn of the current tick as done (the tick ends when every active member is done)."""
        self.finished.add(member)
        self._advance()

    def leave(self, member: str) -> None:
        """Removes ``member`` for good (safe from ``finally`` blocks, also when cancelled)."""
        if member in self.active:
            self.active.remove(member)
        self.finished.discard(member)
        self.observed.discard(member)
        self._advance()

    def _ahead(self, member: str) -> list[str]:
        return self.active[: self.active.index(member)] if member in self.active else []

    def _advance(self) -> None:
        if self.active and all(m in self.finished for m in self.active):
            self.tick += 1
            self.finished.clear()
            self.observed.clear()
        self._signal()
