"""How long the engine's device is busy: the measure behind "is the engine kept busy?".

The driver dispatches a round of device calls (prefills, decode chunks) asynchronously, and the device runs them one
after another. A round is busy from its dispatch, or the previous round's completion if that is later, until its
outputs are ready, less the seconds the driver spent tracing and compiling its calls (the device does not run a call
its caller is still compiling); a watcher thread waits for the outputs so that completion times are not delayed by
the driver's own host work. Busy seconds over a wall-time window is the engine's busy fraction.
"""

from __future__ import annotations

import queue
import threading
import time
from typing import Any, Sequence

import jax


class DeviceClock:
    """Accumulates device-busy seconds of dispatched rounds (thread-safe)."""

    def __init__(self) -> None:
        self._queue: queue.SimpleQueue = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._busy = 0.0
        self._last_ready = 0.0
        self._pending = 0
        self._thread = threading.Thread(target=self._watch, name="sera-device-clock", daemon=True)
        self._thread.start()

    def dispatched(self, t_dispatch: float, outputs: Sequence[Any], compile_s: float = 0.0) -> None:
        """Records a round dispatched at ``t_dispatch`` whose completion is the readiness of ``outputs`` (arrays that
        no later call donates); ``compile_s``: seconds of the dispatch spent tracing and compiling, not busy."""
        with self._lock:
            self._pending += 1
        self._queue.put((t_dispatch, list(outputs), compile_s))

    def _watch(self) -> None:
        while True:
            item = self._queue.get()
            if item is None:
                return
            t0, outs, compile_s = item
            try:
                jax.block_until_ready(outs)
            except Exception:  # noqa: BLE001 - a failed call: its error surfaces in the driver, not here
                pass
            t1 = time.monotonic()
            with self._lock:
                self._busy += max(0.0, t1 - max(t0, self._last_ready) - compile_s)
                self._last_ready = max(self._last_ready, t1)
                self._pending -= 1

    def busy_s(self, *, wait: bool = False, timeout: float = 30.0) -> float:
        """Returns busy seconds of the rounds completed so far (``wait``: after the dispatched ones complete)."""
        if wait:
            deadline = time.monotonic() + timeout
            while self._pending and time.monotonic() < deadline:
                time.sleep(0.001)
        with self._lock:
            return self._busy

    def close(self, timeout: float = 30.0) -> None:
        """Stops the watcher and waits for it: a daemon thread still inside ``block_until_ready`` when the interpreter
        finalizes is unwound through jaxlib's C++ frames and aborts the process ("exception not rethrown")."""
        self._queue.put(None)
        self._thread.join(timeout=timeout)
