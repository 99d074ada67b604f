"""Counts every trace, lowering and compilation JAX does in this process, from ``jax.monitoring`` events.

A jitted call whose cache misses is traced (Python runs the function into a jaxpr), lowered to StableHLO and
compiled (or fetched from the persistent compilation cache: still traced and lowered first, to compute the key).
After a warm-up, a run should do none of these; ``snapshot()`` taken at the end of the warm-up and again later says
how many happened in between, and in which functions.
"""

from __future__ import annotations

import collections
import threading

import jax

TRACE = "/jax/core/compile/jaxpr_trace_duration"
LOWER = "/jax/core/compile/jaxpr_to_mlir_module_duration"
COMPILE = "/jax/core/compile/backend_compile_duration"   # a compile or a persistent-cache fetch
_NAMES = {TRACE: "traces", LOWER: "lowerings", COMPILE: "compiles"}

_lock = threading.Lock()
_counts: collections.Counter = collections.Counter()
_functions: collections.Counter = collections.Counter()
_thread_s: collections.Counter = collections.Counter()  # trace + lower + compile seconds by thread id
_local = threading.local()   # .ahead: this thread compiles ahead of time (a warm-up), counted apart
_installed = False


def _on_duration(event: str, duration: float, **kwargs) -> None:
    name = _NAMES.get(event)
    if name is None:
        return
    ahead = getattr(_local, "ahead", False)
    key = "ahead_" + name if ahead else name
    with _lock:
        _counts[key] += 1
        _counts[key + "_s"] += duration
        _thread_s[threading.get_ident()] += duration
        if name == "traces" and not ahead:
            _functions[str(kwargs.get("fun_name", "?"))] += 1


def install() -> None:
    """Starts counting (idempotent)."""
    global _installed
    with _lock:
        if _installed:
            return
        jax.monitoring.register_event_duration_secs_listener(_on_duration)
        _installed = True


class ahead_of_time:
    """Within it, this thread's traces and compiles are a warm-up's, counted as ``ahead_traces``, … and not in
    ``traces``, … (a background warm-up must not read as a miss of the run it prepares)."""

    def __enter__(self):
        install()
        self._was = getattr(_local, "ahead", False)
        _local.ahead = True
        return self

    def __exit__(self, *exc):
        _local.ahead = self._was
        return False


def snapshot() -> dict[str, float]:
    """Returns the counts so far: traces, lowerings, compiles and their seconds (``traces_s``, …), and those of
    warm-ups compiling ahead of time (``ahead_traces``, …)."""
    install()
    with _lock:
        out = {k: 0.0 for n in _NAMES.values() for p in ("", "ahead_") for k in (p + n, p + n + "_s")}
        out.update(_counts)
        return out


def thread_seconds() -> float:
    """Returns the seconds this thread has spent tracing, lowering and compiling so far (the device runs nothing
    of a call while its caller compiles it)."""
    install()
    with _lock:
        return _thread_s[threading.get_ident()]


def traced_functions() -> dict[str, int]:
    """Returns how many times each function was traced so far."""
    with _lock:
        return dict(_functions)


def since(mark: dict[str, float]) -> dict[str, float]:
    """Returns ``snapshot() - mark`` field by field."""
    now = snapshot()
    return {k: now[k] - mark.get(k, 0.0) for k in now}
