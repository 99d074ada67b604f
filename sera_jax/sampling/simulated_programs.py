"""The simulated device's programs: ``device_loop``'s prefill, start and decode chunk on the host in numpy, with
scripted tokens, each taking the time its ``ProgramTimer`` gives for its shapes.

They keep the real programs' signatures and row-state semantics (token, len, n_gen, done, the recent tokens that
stop sequences match), so the engine's scheduler, block manager, prefix cache and stop handling run unchanged on
their outputs. What a row generates is its request's emission (``simulation.Emission``), one token per position,
the last repeated past its end; a row ends on device exactly where ``device_loop.decode_chunk`` would end it (a stop
id, ``max_new``, a learned stop sequence).

Time. The device is a serial timeline: a program dispatched at t starts at max(t, the end of the one before) and
ends its modelled duration later. Dispatch returns at once, as a real asynchronous dispatch does; its outputs are
``Later`` arrays whose reading (``np.asarray``, ``block_until_ready``) sleeps in the reading thread — the engine's
driver or the device clock's watcher, never the event loop — until the program has ended.
"""

from __future__ import annotations

import dataclasses
import functools
import threading
import time
from typing import Any

import numpy as np

from sera_jax.sampling.simulation import ProgramTimer


class Later:
    """A program's output array, readable once the simulated device has computed it."""

    __slots__ = ("value", "ready_at")

    def __init__(self, value: np.ndarray, ready_at: float):
        self.value, self.ready_at = value, ready_at

    def _wait(self) -> None:
        delay = self.ready_at - time.monotonic()
        if delay > 0:
            time.sleep(delay)

    def __array__(self, dtype=None, copy=None) -> np.ndarray:
        self._wait()
        return self.value if dtype is None else self.value.astype(dtype)

    def block_until_ready(self) -> "Later":
        self._wait()
        return self


@dataclasses.dataclass
class SimRowState:
    """``device_loop.RowState`` in numpy, one entry per engine row [R]."""

    token: np.ndarray
    len: np.ndarray
    n_gen: np.ndarray
    done: np.ndarray
    recent: np.ndarray  # [R, L]

    @classmethod
    def empty(cls, rows: int, recent_len: int) -> "SimRowState":
        return cls(np.zeros(rows, np.int32), np.zeros(rows, np.int32), np.zeros(rows, np.int32),
                   np.ones(rows, bool), np.full((rows, recent_len), -1, np.int32))


class Timeline:
    """One simulated GPU: programs run one after another; busy seconds are the modelled durations (thread-safe)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.free_at = 0.0
        self.busy_s = 0.0
        self.programs = {"prefill": 0, "decode": 0}
        self.program_s = {"prefill": 0.0, "decode": 0.0}

    def run(self, kind: str, seconds: float) -> float:
        """Schedules a program of ``seconds`` dispatched now; returns the monotonic time it ends."""
        with self._lock:
            start = max(time.monotonic(), self.free_at)
            self.free_at = start + seconds
            self.busy_s += seconds
            self.programs[kind] += 1
            self.program_s[kind] += seconds
            return self.free_at


def _stop_seq_hits(recent_BL: np.ndarray, new_BS: np.ndarray, seqs_BQL: np.ndarray) -> np.ndarray:
    """Returns [B, S]: whether the last L tokens after each of the S new tokens end with a stop sequence."""
    b, s = new_BS.shape
    q, length = seqs_BQL.shape[1:]
    if q == 0 or s == 0:
        return np.zeros((b, s), bool)
    ext = np.concatenate([recent_BL, new_BS], axis=1)
    win = np.lib.stride_tricks.sliding_window_view(ext, length, axis=1)[:, 1:]        # [B, S, L]
    agree = (seqs_BQL[:, None] == win[:, :, None]) | (seqs_BQL[:, None] < 0)           # [B, S, Q, L]
    real = np.any(seqs_BQL >= 0, axis=-1)                                               # [B, Q]
    return np.any(np.all(agree, axis=-1) & real[:, None], axis=-1)


def _costed(program):
    """Counts the CPU seconds the stand-in itself takes (``cpu_s``): a simulation cost, not the host path's."""
    @functools.wraps(program)
    def run(self, *args):
        t0 = time.thread_time()
        try:
            return program(self, *args)
        finally:
            self.cpu_s += time.thread_time() - t0
    return run


class SimulatedPrograms:
    """The three device programs of one simulated engine; ``slots`` is the scheduler's slot list (rows → requests)
    and each request carries its emission as ``req.sim`` = (token ids, logprobs) arrays."""

    def __init__(self, timer: ProgramTimer, slots: list, steps: int):
        self.timer, self.slots, self.steps = timer, slots, steps
        self.device = Timeline()
        self.scripts: dict[int, tuple[np.ndarray, np.ndarray]] = {}  # row → its request's emission
        self.cpu_s = 0.0

    @_costed
    def prefill(self, params, pool, tokens, ctx_len, new_len, table, ctx_table) -> tuple[Any, Later]:
        b, t = tokens.shape  # padding rows (new_len 1, nothing cached) are computed too, as on the device
        ready = self.device.run("prefill", self.timer.prefill_s(b, t, ctx_len, new_len))
        return pool, Later(np.zeros(b, np.float32), ready)

    @_costed
    def start(self, state: SimRowState, logits: Later, ctx_len, new_len, slot, rows):
        ready, b = logits.ready_at, len(slot)
        tok = np.zeros(b, np.int32)
        lp = np.zeros(b, np.float32)
        valid = slot < len(state.token)
        for i in np.flatnonzero(valid):
            req = self.slots[slot[i]]
            ids, lps = req.sim
            self.scripts[int(slot[i])] = (ids, lps)
            tok[i], lp[i] = ids[0], lps[0]
        before = np.full((b, state.recent.shape[1]), -1, np.int32)
        recent = np.concatenate([before[:, 1:], tok[:, None]], axis=1)
        done = (np.any(tok[:, None] == rows["stop_ids"], axis=-1) | (rows["max_new"] <= 1)
                | _stop_seq_hits(before, tok[:, None], rows["stop_seqs"])[:, 0])
        s = slot[valid]
        state.token[s], state.len[s], state.n_gen[s] = tok[valid], (ctx_len + new_len)[valid], 1
        state.done[s], state.recent[s] = done[valid], recent[valid]
        k = (b, 0)
        return (state, Later(tok, ready), Later(lp, ready), Later(done, ready), Later(np.zeros(k, np.int32), ready),
                Later(np.zeros(k, np.float32), ready))

    @_costed
    def decode(self, params, pool, state: SimRowState, index, table, alive, rows):
        b, steps, n_rows = len(index), self.steps, len(state.token)
        inside = index < n_rows
        idx = np.minimum(index, n_rows - 1)
        active = inside & alive & ~state.done[idx]
        n_gen, length, recent = state.n_gen[idx], state.len[idx], state.recent[idx]
        toks = np.full((b, steps), -1, np.int32)
        lps = np.zeros((b, steps), np.float32)
        for i in np.flatnonzero(active):
            ids, lp = self.scripts[int(index[i])]
            pos = np.minimum(n_gen[i] + np.arange(steps), len(ids) - 1)
            toks[i], lps[i] = ids[pos], lp[pos]
        hit = (np.any(toks[:, :, None] == rows["stop_ids"][:, None, :], axis=-1)
               | (n_gen[:, None] + np.arange(1, steps + 1)[None] >= rows["max_new"][:, None])
               | _stop_seq_hits(recent, toks, rows["stop_seqs"]))
        ended = hit.any(axis=1) & active
        count = np.where(ended, np.argmax(hit, axis=1) + 1, steps) * active
        keep = np.arange(steps)[None] < count[:, None]
        out_tok, out_lp = np.where(keep, toks, -1), np.where(keep, lps, 0.0).astype(np.float32)
        ran = int(count.max(initial=0))
        contexts = length[active][:, None] + np.minimum(np.arange(ran)[None], count[active][:, None])
        ready = self.device.run("decode", self.timer.decode_s(b, contexts.sum(axis=0)))
        rows_ = index[active]
        if len(rows_):
            c = count[active]
            ext = np.concatenate([recent[active], toks[active]], axis=1)
            width = recent.shape[1]
            state.recent[rows_] = np.stack([ext[j, c[j]:c[j] + width] for j in range(len(c))])
            state.token[rows_] = toks[active][np.arange(len(c)), np.maximum(c - 1, 0)]
            state.len[rows_] += c
            state.n_gen[rows_] += c
            state.done[rows_] = ended[active]
        state.done[index[inside & ~alive]] = True
        k = (b, steps, 0)
        return (pool, state, Later(out_tok, ready), Later(out_lp, ready), Later(np.zeros(k, np.int32), ready),
                Later(np.zeros(k, np.float32), ready))
