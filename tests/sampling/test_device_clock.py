"""The engine's busy clock: device time of dispatched rounds, without the driver's compile time or idle gaps."""

from __future__ import annotations

import threading
import time

import jax
import jax.numpy as jnp

from sera_jax.sampling import compile_watch
from sera_jax.sampling.device_clock import DeviceClock


def test_busy_time_counts_rounds_once_and_not_their_compile_seconds():
    clock = DeviceClock()
    try:
        ready = jnp.ones(3)
        now = time.monotonic()
        clock.dispatched(now - 1.0, [ready], compile_s=0.4)   # 1 s since dispatch, 0.4 s of it compiling
        first = clock.busy_s(wait=True)
        assert 0.55 < first < 0.75, first
        # A round dispatched before the last one completed is busy only from that completion: not counted twice.
        clock.dispatched(now - 1.0, [ready])
        assert clock.busy_s(wait=True) - first < 0.1
    finally:
        clock.close()


def test_compile_seconds_are_counted_for_the_thread_that_compiles():
    before, counts = compile_watch.thread_seconds(), compile_watch.snapshot()
    jax.jit(lambda x: jnp.sin(x) * 3.0 + x.shape[0])(jnp.ones(17)).block_until_ready()
    after = compile_watch.since(counts)
    assert after["traces"] >= 1 and after["compiles"] >= 1
    assert compile_watch.thread_seconds() - before >= after["compiles_s"] > 0


def test_a_warm_up_compiling_ahead_of_time_is_counted_apart_from_the_runs_misses():
    mark = compile_watch.snapshot()
    with compile_watch.ahead_of_time():
        jax.jit(lambda x: jnp.cos(x) - 2.0 * x.shape[0])(jnp.ones(19)).block_until_ready()
    d = compile_watch.since(mark)
    assert d["compiles"] == 0 and d["traces"] == 0
    assert d["ahead_compiles"] >= 1 and d["ahead_traces"] >= 1
    jax.jit(lambda x: jnp.tan(x) + x.shape[0])(jnp.ones(23)).block_until_ready()   # outside: a miss again
    assert compile_watch.since(mark)["compiles"] >= 1


def test_close_waits_for_the_watcher_so_no_thread_is_inside_jax_at_exit():
    # A daemon thread still waiting on device outputs when the interpreter finalizes aborts the process
    # ("terminate called ... exception not rethrown"): close must leave no watcher running.
    others = {t for t in threading.enumerate() if t.name == "sera-device-clock"}  # other tests' engines' clocks
    clock = DeviceClock()
    x = jnp.ones((256, 256))
    clock.dispatched(time.monotonic(), [jax.jit(lambda a: (a @ a) @ a)(x)])
    clock.close()
    assert not [t for t in threading.enumerate() if t.name == "sera-device-clock" and t not in others]
