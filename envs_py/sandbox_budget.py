"""What the host allows one cell, kept on the host whatever the cell does inside (issue #55): wall-clock seconds, of
which only the host's own waits on async tools (sub-agents) may pause, and only up to a cap; and CPU seconds, read
from the sandbox process's own times in ``/proc`` plus the host CPU spent serving the cell's synchronous calls.

The sandbox enforces its own CPU and wall limits too (timers inside the process, which a determined cell can
switch off); the host's budgets are those limits plus the grace seconds, so a cell that keeps its timers meets
its own limit first and keeps its namespace, and one that does not is killed by the host.
"""

from __future__ import annotations

import os
import time

_TICK = os.sysconf("SC_CLK_TCK")


def process_cpu(pid: int | None) -> float | None:
    """Returns process ``pid``'s user + system CPU seconds so far, all its threads (None once it is gone)."""
    if pid is None:
        return None
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            fields = f.read().rsplit(b")", 1)[1].split()
    except (OSError, IndexError):
        return None
    return (int(fields[11]) + int(fields[12])) / _TICK


class CellBudget:
    """One cell's budgets on the host, from ``start`` (loop time): ``wall_s`` seconds of wall clock, not counting at
    most ``pause_cap_s`` seconds during which an async tool call of the host's was in flight, and ``cpu_s`` CPU
    seconds of the sandbox process ``pid`` plus the host's service time (``charge``)."""

    def __init__(self, wall_s: float, cpu_s: float, pause_cap_s: float, pid: int | None, start: float):
        self.wall_s, self.cpu_s, self.pause_cap_s, self.pid, self.start = wall_s, cpu_s, pause_cap_s, pid, start
        self.paused = 0.0  # seconds paused in closed intervals
        self.paused_since: float | None = None
        self.cpu0 = process_cpu(pid) or 0.0
        self.host_cpu = 0.0
        self.cpu_seen = 0.0

    def pause(self, now: float) -> None:
        """An async tool call is now in flight (and none was)."""
        if self.paused_since is None:
            self.paused_since = now

    def resume(self, now: float) -> None:
        """No async tool call is in flight any more."""
        if self.paused_since is not None:
            self.paused += now - self.paused_since
            self.paused_since = None

    def charge(self, seconds: float) -> None:
        """Adds host CPU seconds spent serving this cell (decoding its calls, running their handlers, replying)."""
        self.host_cpu += seconds

    def wall_used(self, now: float) -> float:
        """Returns the wall seconds counted against the cell at ``now``."""
        paused = self.paused + (now - self.paused_since if self.paused_since is not None else 0.0)
        return now - self.start - min(paused, self.pause_cap_s)

    def cpu_used(self) -> float:
        """Returns the CPU seconds counted against the cell so far (the sandbox's own read now, plus the host's)."""
        cpu = process_cpu(self.pid)
        if cpu is not None:
            self.cpu_seen = cpu - self.cpu0
        return self.cpu_seen + self.host_cpu

    def check(self, now: float) -> tuple[str | None, float]:
        """Returns (the budget the cell has overrun, "wall" or "cpu", or None; seconds until it is worth checking
        again). The CPU is read from ``/proc`` only here: the sandbox and the host together cannot use more than two
        CPU seconds per wall second, so the next check comes when half the CPU left could have been used."""
        wall_left = self.wall_s - self.wall_used(now)
        if wall_left <= 0:
            return "wall", 0.0
        if self.paused_since is not None:  # the wall clock runs again once the pause cap is spent
            wall_left += max(0.0, self.pause_cap_s - self.paused - (now - self.paused_since))
        cpu_left = self.cpu_s - self.cpu_used()
        if cpu_left <= 0:
            return "cpu", 0.0
        return None, max(0.02, min(wall_left, cpu_left / 2))


def thread_cpu() -> float:
    """Returns this thread's CPU seconds so far (what the host's service of a call costs)."""
    return time.thread_time()
