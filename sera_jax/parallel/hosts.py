"""Several processes (hosts) as one job: start-up, who runs which admission ranks, small host-side exchanges, and
watching the peers.

Multi-host is multi-controller: every host runs the same command with ``SERA_COORDINATOR=host0:port
SERA_NUM_PROCESSES=N SERA_PROCESS_ID=i`` (or JAX's own ``JAX_COORDINATOR_ADDRESS`` / ``JAX_NUM_PROCESSES`` /
``JAX_PROCESS_ID``). ``start_distributed()`` must run before anything touches the XLA backend; every command that
builds devices calls it first. On CPU it selects gloo collectives, so one machine can play two hosts.

Exchanges of small host figures (step statistics, the data cursors of each process's ranks, evaluation results) go
through the coordination service's key-value store (``allgather_json``), not through device collectives: they run
while engines decode on the devices, never enter a compiled program, and every wait is bounded and names the
process it is waiting for. Which global program runs next is then computed identically on every process from the
gathered figures.

A process that dies (a crash, a SIGKILL, a lost host) is seen by the coordination service when its heartbeats stop
(``SERA_HEARTBEAT_TIMEOUT_S``, default 30 s). The job runs in JAX's recoverable mode, so that the survivors are not
aborted from C++ but told: ``PeerWatch`` polls the live set and ends the process with a message that names the lost
process, and the exit status ``PEER_LOST`` (75, "try again": every process started again resumes from the newest
checkpoint).
"""

from __future__ import annotations

import json
import os
import sys
import threading
import time
from typing import Any, Callable

import jax

PEER_LOST = 75  # EX_TEMPFAIL: the job lost a process; starting every process again resumes it
_ENV = (("SERA_COORDINATOR", "JAX_COORDINATOR_ADDRESS"), ("SERA_NUM_PROCESSES", "JAX_NUM_PROCESSES"),
        ("SERA_PROCESS_ID", "JAX_PROCESS_ID"))


class DistributedError(RuntimeError):
    """A multi-process start-up or exchange failed in a way the user can act on (the message says how)."""


def _setting(names: tuple[str, str]) -> tuple[str | None, str | None]:
    for name in names:
        if os.environ.get(name, "").strip():
            return name, os.environ[name].strip()
    return None, None


def distributed_settings() -> tuple[str, int, int] | None:
    """Returns (coordinator address, process count, process id) from the environment, or None for one process.

    Raises DistributedError naming the variable when the settings are incomplete or inconsistent."""
    (a_name, addr), (n_name, n), (i_name, i) = (_setting(names) for names in _ENV)
    if addr is None and n is None and i is None:
        return None
    try:
        num = int(n) if n is not None else None
        pid = int(i) if i is not None else None
    except ValueError:
        raise DistributedError(f"{n_name if n is not None and not n.isdigit() else i_name} must be an integer, "
                               f"got {n if n is not None and not n.isdigit() else i!r}") from None
    if num is not None and num == 1 and addr is None:
        return None
    missing = [names[0] for names, v in zip(_ENV, (addr, num, pid)) if v is None]
    if missing:
        raise DistributedError(f"a multi-process run needs SERA_COORDINATOR, SERA_NUM_PROCESSES and "
                               f"SERA_PROCESS_ID together; missing {', '.join(missing)}")
    if num < 1:
        raise DistributedError(f"{n_name} must be at least 1, got {num}")
    if not 0 <= pid < num:
        raise DistributedError(f"{i_name}={pid} is not a process id of a {num}-process job (0..{num - 1})")
    if ":" not in addr or not addr.rsplit(":", 1)[1].isdigit():
        raise DistributedError(f"{a_name} must be host:port, got {addr!r}")
    return addr, num, pid


def start_distributed(*, init_timeout_s: int | None = None) -> bool:
    """Starts JAX's distributed runtime when the environment names a multi-process job; returns whether this is one.

    Idempotent (a second call returns True at once). Must run before any backend use. On a CPU-only job it picks
    gloo collectives. A coordinator that does not answer within ``init_timeout_s`` (``SERA_INIT_TIMEOUT_S``, default
    120 s) ends in DistributedError, not a hang.
    """
    from jax._src import distributed

    if distributed.global_state.client is not None:
        return True
    settings = distributed_settings()
    if settings is None:
        return False
    addr, num, pid = settings
    # CPU collectives through gloo (a CPU job's only cross-process ones; a GPU job's NCCL ones are untouched).
    jax.config.update("jax_cpu_collectives_implementation", "gloo")
    # Recoverable: a lost peer is reported to the survivors (PeerWatch) instead of aborting them from C++.
    jax.config.update("jax_enable_recoverability", True)
    # SIGTERM stays Python's (a preemption saves through the loop's own stop path, agreed at the step's exchange).
    jax.config.update("jax_enable_preemption_service", False)
    timeout = init_timeout_s or int(os.environ.get("SERA_INIT_TIMEOUT_S", "120"))
    try:
        jax.distributed.initialize(addr, num, pid, initialization_timeout=timeout,
                                   heartbeat_timeout_seconds=heartbeat_timeout_s())
    except Exception as e:
        if "backend" in str(e).lower() and "before" in str(e).lower():
            raise  # a programming error: something touched the backend first
        raise DistributedError(f"process {pid} of {num} could not join the job at {addr} within {timeout} s "
                               f"({type(e).__name__}: {str(e).splitlines()[0][:200]}). Check that process 0 runs "
                               "with the same SERA_COORDINATOR and that every process has a distinct "
                               "SERA_PROCESS_ID") from None
    return True


def heartbeat_timeout_s() -> int:
    """Returns the seconds without heartbeats after which a process counts as lost (``SERA_HEARTBEAT_TIMEOUT_S``)."""
    return int(os.environ.get("SERA_HEARTBEAT_TIMEOUT_S", "30"))


def is_multiprocess() -> bool:
    """Returns whether this job has more than one process (the runtime must have been started)."""
    return jax.process_count() > 1


def deal_ranks(num_ranks: int, process_index: int | None = None, process_count: int | None = None) -> list[int]:
    """Returns the admission ranks process ``process_index`` runs: a contiguous block, the first ``num_ranks mod
    process_count`` processes one more (with fewer ranks than processes, some run none). The blocks concatenated
    in process order are 0..num_ranks-1, so figures gathered in process order are in rank order."""
    p = jax.process_index() if process_index is None else process_index
    n = jax.process_count() if process_count is None else process_count
    base, extra = divmod(num_ranks, n)
    start = p * base + min(p, extra)
    return list(range(start, start + base + (1 if p < extra else 0)))


def _client():
    from jax._src import distributed

    client = distributed.global_state.client
    if client is None:
        raise DistributedError("the distributed runtime is not started (start_distributed)")
    return client


class Exchange:
    """All-gathers JSON-able host values over the coordination service's key-value store.

    Every process calls ``allgather`` the same number of times in the same order (as with a collective); call k of
    tag t of process p writes key ``sera/<run>/<t>/<k>/<p>``. A wait longer than ``timeout_s`` (default: unbounded
    but watched: a lost peer ends the wait through ``PeerWatch``), or a peer reported lost, raises
    DistributedError naming the process.
    """

    def __init__(self, run: str = "run", *, poll_s: float = 2.0):
        self.run, self.poll_s = run, poll_s
        self._seq: dict[str, int] = {}

    def allgather(self, value: Any, tag: str = "x", *, timeout_s: float | None = None) -> list[Any]:
        """Returns every process's ``value`` (as JSON round-trips it), in process order."""
        n, me = jax.process_count(), jax.process_index()
        if n == 1:
            return [json.loads(json.dumps(value))]
        k = self._seq.get(tag, 0)
        self._seq[tag] = k + 1
        client = _client()
        prefix = f"sera/{self.run}/{tag}/{k}"
        client.key_value_set_bytes(f"{prefix}/{me}", json.dumps(value).encode())
        out: list[Any] = []
        t0 = time.monotonic()
        for p in range(n):
            if p == me:
                out.append(json.loads(json.dumps(value)))
                continue
            while True:
                try:
                    out.append(json.loads(client.blocking_key_value_get_bytes(f"{prefix}/{p}",
                                                                              int(self.poll_s * 1000))))
                    break
                except Exception as e:  # noqa: BLE001 - jaxlib's runtime error: a timeout or a lost service
                    if "DEADLINE_EXCEEDED" not in str(e) and "timed out" not in str(e):
                        raise DistributedError(f"lost the coordination service (process 0) while waiting for "
                                               f"process {p}: {str(e).splitlines()[0][:200]}") from None
                    lost = lost_processes()
                    if p in lost:
                        raise DistributedError(f"process {p} of {n} is gone (no heartbeat for "
                                               f"{heartbeat_timeout_s()} s) while this process waited for its "
                                               f"'{tag}' figures") from None
                    if timeout_s is not None and time.monotonic() - t0 > timeout_s:
                        raise DistributedError(f"process {p} of {n} sent no '{tag}' figures within {timeout_s:.0f} "
                                               "s") from None
        if k >= 2:  # keys of two calls ago are read by everyone by now (each call waits for all processes)
            try:
                client.key_value_delete(f"sera/{self.run}/{tag}/{k - 2}/{me}")
            except Exception:  # noqa: BLE001 - housekeeping only
                pass
        return out

    def barrier(self, name: str, timeout_s: float = 600.0) -> None:
        """Waits until every process reaches ``name`` (bounded; a lost process raises DistributedError)."""
        self.allgather(None, f"barrier-{name}", timeout_s=timeout_s)


def lost_processes() -> list[int]:
    """Returns the processes the coordination service no longer hears from (empty in a one-process job).

    Raises DistributedError when the service itself (hosted by process 0) is gone."""
    n = jax.process_count()
    if n == 1:
        return []
    try:
        live = _client().get_live_nodes(list(range(n)))
    except Exception as e:  # noqa: BLE001
        raise DistributedError(f"lost the coordination service hosted by process 0 "
                               f"({str(e).splitlines()[0][:200]})") from None
    return [p for p in range(n) if p not in live]


class PeerWatch:
    """A daemon thread that ends this process (status ``PEER_LOST``) soon after another process of the job is lost.

    Why a thread: a survivor may be deep in a rollout, a compile or a collective whose peer will never answer; the
    watch sees the coordination service's verdict within ``poll_s`` of it and exits with one clear line instead of
    hanging. ``on_lost`` runs first (best effort: e.g. stopping env worker processes). ``stop()`` before an orderly
    shutdown, where peers legitimately leave.
    """

    def __init__(self, *, poll_s: float = 1.0, on_lost: Callable[[str], None] | None = None,
                 prog: str = "sera"):
        self.poll_s, self.on_lost, self.prog = poll_s, on_lost, prog
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> "PeerWatch":
        if jax.process_count() > 1 and self._thread is None:
            self._thread = threading.Thread(target=self._run, name="sera-peer-watch", daemon=True)
            self._thread.start()
        return self

    def _run(self) -> None:
        n, me = jax.process_count(), jax.process_index()
        while not self._stop.wait(self.poll_s):
            try:
                lost = lost_processes()
                if not lost:
                    continue
                why = (f"process {', '.join(map(str, lost))} of {n} stopped (no heartbeat for "
                       f"{heartbeat_timeout_s()} s)")
            except DistributedError as e:
                why = str(e)
            if self._stop.is_set():
                return
            msg = (f"{self.prog}: {why}; process {me} exits. Start every process again to resume from the newest "
                   "checkpoint.")
            print(msg, file=sys.stderr, flush=True)
            if self.on_lost is not None:
                try:
                    self.on_lost(msg)
                except Exception:  # noqa: BLE001 - exiting anyway
                    pass
            os._exit(PEER_LOST)  # the main thread may be blocked in a collective that will never complete

    def stop(self) -> None:
        self._stop.set()


def finish_distributed(exchange: Exchange | None = None, watch: PeerWatch | None = None,
                       timeout_s: float = 300.0) -> None:
    """Ends a multi-process job in order: stop watching, wait for every process (so that none is left talking to a
    coordinator that has gone), then shut the runtime down. No-op for one process."""
    if jax.process_count() == 1:
        return
    if watch is not None:
        watch.stop()
    (exchange or Exchange("finish")).barrier("finish", timeout_s=timeout_s)
    # Process 0 hosts the coordination service: it leaves last, once every other process has disconnected (a
    # client whose service is gone when it says goodbye is aborted from C++).
    if jax.process_index() == 0:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            try:
                if set(_client().get_live_nodes(list(range(jax.process_count())))) <= {0}:
                    break
            except Exception:  # noqa: BLE001 - the service is ours: nothing to wait for
                break
            time.sleep(0.2)
    jax.distributed.shutdown()
