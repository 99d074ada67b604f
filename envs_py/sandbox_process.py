"""The processes behind a sandbox: the zygote (a fork server), a fork addressed by pidfd, and the pair a sandbox
is under its kernel layers: the keeper the host started (or the zygote forked) and the sandbox proper, pid 1 of its
own PID namespace, which the host stops between cells and kills (see ``sandbox_jail.py``).
"""

from __future__ import annotations

import importlib.util
import json
import os
import select
import signal
import socket
import subprocess
import sys
import threading

CHILD = os.path.join(os.path.dirname(os.path.abspath(__file__)), "sandbox_child.py")
UNISOLATED_ENV = "SERA_SANDBOX_UNISOLATED"


def seccomp_lib() -> str:
    """Returns the directory holding the ``pyseccomp`` module ("" if it is not installed): the sandbox runs under
    ``python -I -S``, without site-packages, and imports it from there."""
    spec = importlib.util.find_spec("pyseccomp")
    return os.path.dirname(spec.origin) if spec is not None and spec.origin else ""


def child_options() -> dict:
    """Returns what every sandbox process is told at start: where pyseccomp is, and whether running without
    isolation was accepted (``SERA_SANDBOX_UNISOLATED=1``)."""
    return {"lib": seccomp_lib(), "unisolated": os.environ.get(UNISOLATED_ENV, "") == "1"}


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
            self.proc = subprocess.Popen([sys.executable, "-I", "-S", "-B", CHILD, "--zygote",
                                          json.dumps(child_options())], stdin=theirs,
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

    def send_signal(self, sig: int) -> None:
        if self.pidfd is not None:
            try:
                signal.pidfd_send_signal(self.pidfd, sig)
            except ProcessLookupError:
                pass

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)

    def wait(self, timeout: float | None = None) -> int:
        if not self._exited(timeout):
            raise subprocess.TimeoutExpired("sandbox", timeout)
        self._ended()
        return self.returncode




class SandboxProcess:
    """A started sandbox: ``outer`` is the process the host started or the zygote forked (a ``Popen`` or
    :class:`Forked`), ``inner`` the pidfd of the sandbox proper once its ``jail`` frame named it (None where it runs
    without namespaces: then the outer process is the sandbox). The part of ``subprocess.Popen`` a Sandbox uses,
    plus ``stop``/``cont``."""

    def __init__(self, outer: "subprocess.Popen | Forked"):
        self.outer, self.inner, self.inner_pid = outer, None, None

    def adopt(self, pid: int) -> bool:
        """Takes the sandbox proper's pid from its keeper; returns whether it is (still) there. Its keeper reaps it
        only when it has ended, so while the keeper lives the pid cannot be reused."""
        try:
            fd = os.pidfd_open(pid)
        except OSError:
            return False
        if self.outer.poll() is not None:
            os.close(fd)
            return False
        self.inner, self.inner_pid = fd, pid
        return True

    @property
    def pid(self) -> int:
        return self.inner_pid if self.inner is not None else self.outer.pid

    def poll(self) -> int | None:
        return self.outer.poll()

    def signal(self, sig: int) -> None:
        """Sends ``sig`` to the sandbox proper (never to a reused pid)."""
        try:
            if self.inner is not None:
                signal.pidfd_send_signal(self.inner, sig)
            elif self.outer.poll() is None:
                self.outer.send_signal(sig)
        except (ProcessLookupError, OSError):
            pass

    def stop(self) -> None:
        """Freezes the sandbox (between cells nothing in it runs)."""
        self.signal(signal.SIGSTOP)

    def cont(self) -> None:
        self.signal(signal.SIGCONT)

    def kill(self) -> None:
        self.signal(signal.SIGKILL)  # the namespace's init: everything in it dies
        if self.outer.poll() is None:
            self.outer.kill()

    def wait(self, timeout: float | None = None) -> int:
        code = self.outer.wait(timeout)
        if self.inner is not None:
            os.close(self.inner)
            self.inner = None
        return code
