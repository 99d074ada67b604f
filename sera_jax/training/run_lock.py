"""One writer per run directory: ``run.lock`` names the holder (host, pid, command, start time).

The lock is an ``fcntl.flock`` on that file: the kernel drops it when the holder dies, however it dies (SIGKILL
included), so a lock never outlives its process on a local filesystem, nor on NFSv4, which forwards it. The file's
content is only the holder's name for the refusal message. It is never deleted (a process that opened it before
the unlink would lock a file nobody else sees); released, it is emptied. A file that still names a holder whose lock
is gone is a stale lock: its process died without releasing; the next writer takes it over with a warning.

Readers (``sera-eval``, ``sera-export``, ``sera-view``) take no lock. In a multi-process run only process 0 holds it.
"""

from __future__ import annotations

import fcntl
import json
import os
import shutil
import socket
import sys
import time
from pathlib import Path
from typing import Any, Callable

from sera_jax.config.errors import UserError

LOCK_FILE = "run.lock"


class RunLocked(UserError):
    """Another live process writes this run directory."""


def _command_line() -> str:
    """Returns this process's command line as the lock names it (``sera-train a.b=c --out DIR``), cut to 300
    characters."""
    argv = list(sys.argv)
    if argv and argv[0].endswith(".py") and "sera_jax" in argv[0]:
        argv[0] = "python -m " + ".".join(Path(argv[0]).with_suffix("").parts[-3:])  # python -m sera_jax.cli.train
    else:
        argv[0] = Path(argv[0]).name if argv else "?"
    text = " ".join(argv)
    return text if len(text) <= 300 else text[:297] + "..."


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # someone else's process: alive
    return True


def describe(holder: dict[str, Any]) -> str:
    """Returns the holder record as words: ``pid 123 on host h since 2026-… (sera-train …)``."""
    return (f"pid {holder.get('pid', '?')} on host {holder.get('host', '?')} since {holder.get('since', '?')} "
            f"({holder.get('command', '?')})")


def _read(fd: int) -> dict[str, Any] | None:
    os.lseek(fd, 0, os.SEEK_SET)
    raw = os.read(fd, 1 << 16)
    if not raw.strip():
        return None
    try:
        data = json.loads(raw)
    except ValueError:
        return {"command": "unknown", "pid": "?", "host": "?"}
    return data if isinstance(data, dict) else None


class RunLock:
    """The writer's lock on one run directory (``acquire`` / ``release``, or as a context manager)."""

    def __init__(self, directory: str | Path, command: str | None = None, *,
                 warn: Callable[[str], None] | None = None):
        self.directory = Path(directory)
        self.path = self.directory / LOCK_FILE
        self.command = command or _command_line()
        self.warn = warn or (lambda m: print(m, file=sys.stderr, flush=True))
        self._fd: int | None = None
        self._created = False

    def acquire(self) -> dict[str, Any] | None:
        """Takes the lock (creating the directory); returns the stale holder it took over, or None.

        Raises ``RunLocked`` naming the holder when a live process holds it."""
        self._created = not self.directory.exists()
        self.directory.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                locked = True
            except BlockingIOError:
                holder = _read(fd) or {}
                raise RunLocked(f"{self.directory} is being written by {describe(holder)}; wait for it to end, "
                                "or give another --out") from None
            except OSError:
                locked = False  # a filesystem without flock: the record alone decides
            previous = _read(fd)
            me = {"host": socket.gethostname(), "pid": os.getpid()}
            if previous is not None and (previous.get("host"), previous.get("pid")) != (me["host"], me["pid"]):
                same_host = previous.get("host") == me["host"]
                pid = previous.get("pid")
                # With the flock taken, the recorded holder no longer holds it: it died (or its pid is reused).
                if not locked and (not same_host or (isinstance(pid, int) and _alive(pid))):
                    raise RunLocked(f"{self.directory} is being written by {describe(previous)} (this filesystem "
                                    f"has no file locks; delete {self.path} if that process is gone)")
                self.warn(f"took over the stale lock of {describe(previous)} on {self.directory} (that process "
                          "is gone)")
            record = {**me, "command": self.command, "since": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
            os.ftruncate(fd, 0)
            os.lseek(fd, 0, os.SEEK_SET)
            os.write(fd, (json.dumps(record) + "\n").encode())
            os.fsync(fd)
        except BaseException:
            os.close(fd)
            raise
        self._fd = fd
        return previous

    def release(self) -> None:
        """Empties the record and drops the lock (idempotent). A directory this lock created that holds no file
        but the lock (a run that failed before writing anything) is removed: a mistake leaves no empty folder."""
        if self._fd is None:
            return
        fd, self._fd = self._fd, None
        try:
            os.ftruncate(fd, 0)
        finally:
            os.close(fd)  # closing drops the flock
        if self._created and all(
                Path(root, f) == self.path for root, _, files in os.walk(self.directory) for f in files):
            shutil.rmtree(self.directory, ignore_errors=True)

    def __enter__(self) -> "RunLock":
        self.acquire()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.release()
