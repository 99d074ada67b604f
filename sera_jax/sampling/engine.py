"""The rollout engine: an asyncio ``generate`` for many concurrent agents over one batched device loop.

Usage::

    engine = Engine(cfg, params, EngineConfig(max_batch=64, num_blocks=4096, max_context=13312), mesh=mesh)
    engine.warmup()                                    # optional: compile every bucket now
    result = await engine.generate(prompt_ids, SamplingParams(max_new_tokens=512, stop_strings=("</python>",)),
                                   key=jax.random.fold_in(rollout_key, turn))
    engine.load_weights(trainer_params)                # on-device reshard + cast; bumps result.policy_version

A background driver thread owns the device loop, so the event loop (agents, env RPCs) keeps running while the device
decodes. Each round it admits waiting requests, dispatches up to ``EngineConfig.prefill_calls`` prefill calls and
the decode chunks (a jitted ``lax.while_loop`` each; rows of very different context lengths may go in separate chunks,
see ``EngineConfig.decode_groups``). By default it waits for a round to end and parses it before dispatching the next,
so the rows that finished free their slots and the turns their agents sent meanwhile join at once, and hands the
finished turns back only after that dispatch, so their agents' host work overlaps the device's round
(``EngineConfig.dispatch_ahead`` dispatches the next round before parsing the last instead: the device never waits
for the host, and agents wait a round longer). Cancelling the awaiting coroutine frees the request's slot and
blocks.

Parameter layout: the sampler keeps its own copy of the weights in ``EngineConfig.dtype`` laid out by ``rules``
(default ``SAMPLE_RULES``: a replica per ``data`` group, tensor-parallel over ``tensor``). With ``mesh=None`` the
engine runs on one device (a replica); build one engine per device or one tensor-parallel engine per host.
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import itertools
import queue
import threading
import time
from typing import Any, Sequence

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from sera_jax.model.config import Qwen3Config
from sera_jax.model.qwen3 import abstract_params
from sera_jax.model.sharding import param_shardings
from sera_jax.parallel.mesh import MeshConfig, activate, make_mesh
from sera_jax.parallel.rules import SAMPLE_RULES, Rules
from sera_jax.sampling import compile_watch
from sera_jax.sampling.device_clock import DeviceClock
from sera_jax.sampling.device_loop import decode_chunk, init_state, prefill, start_rows
from sera_jax.sampling.engine_config import EngineConfig
from sera_jax.sampling.paged_cache import make_pool, pool_sharding
from sera_jax.sampling.request import Request, make_request
from sera_jax.sampling.scheduler import Scheduler
from sera_jax.sampling.types import GenerationResult, SamplingParams


@dataclasses.dataclass(frozen=True)
class DeviceFunctions:
    """The engine's jitted device functions (see ``device_loop``) and the layouts they keep."""

    prefill: Any        # (params, pool, tokens, ctx_len, new_len, table, ctx_table) -> (pool, logits)
    start: Any          # (state, logits, ctx_len, new_len, slot, rows) -> (state, token, logprob, done, top ids, top lps)
    decode: Any         # (params, pool, state, index, table, alive, rows) -> (pool, state, tokens, logprobs, top ids,
    #                     top lps)
    pool_sharding: NamedSharding
    replicated: NamedSharding


def device_functions(cfg: Qwen3Config, config: EngineConfig, mesh: Mesh, rules: Rules = SAMPLE_RULES
                     ) -> DeviceFunctions:
    """Returns the jitted prefill / start / decode of an engine with sampler config ``cfg`` (its compute dtype) on
    ``mesh``: the pool and the row state are donated and keep their layouts. Shared by ``Engine`` and the
    deviceless compile (``profiling.aot``), which lowers them for a described GPU.

    Memoised on what the functions depend on: engines on the same device with the same block size, chunk length
    and compiler options (the tiny default's evaluations before and after training, engines differing only in
    their host-side scheduling) share one set of jitted functions, so a shape traced for one is never traced again
    for the next."""
    return _device_functions(cfg, config.block_size, config.chunk_steps, config.top_logprobs, config.compiler_options,
                             mesh, rules)


@functools.lru_cache(maxsize=16)
def _device_functions(cfg: Qwen3Config, block_size: int, chunk_steps: int, top_k: int, compiler_options: tuple,
                      mesh: Mesh, rules: Rules) -> DeviceFunctions:
    pool_sh = pool_sharding(mesh, rules)
    pool_shs = {"k": pool_sh, "v": pool_sh}
    opts = dict(compiler_options) or None
    rep = NamedSharding(mesh, PartitionSpec())
    prefill_fn = jax.jit(functools.partial(prefill, cfg=cfg, block_size=block_size), donate_argnums=(1,),
                         out_shardings=(pool_shs, rep), compiler_options=opts)
    start_fn = jax.jit(functools.partial(start_rows, top_k=top_k), donate_argnums=(0,), out_shardings=(rep,) * 6,
                       compiler_options=opts)
    decode_fn = jax.jit(functools.partial(decode_chunk, cfg=cfg, block_size=block_size, steps=chunk_steps,
                                          top_k=top_k),
                        donate_argnums=(1, 2), out_shardings=(pool_shs,) + (rep,) * 5, compiler_options=opts)
    return DeviceFunctions(prefill_fn, start_fn, decode_fn, pool_sh, rep)


class EngineError(RuntimeError):
    """The engine's driver failed or the engine was closed; pending requests get this error."""


class Engine:
    """Continuous-batching generator over a paged KV cache. Implements ``sampling.types.Generator``."""

    def __init__(self, cfg: Qwen3Config, params, config: EngineConfig | None = None, *, mesh: Mesh | None = None,
                 rules: Rules = SAMPLE_RULES, tokenizer: Any = None, seed: int = 0):
        self.config = config = config or EngineConfig()
        self.model_cfg = cfg
        self.cfg = cfg.replace(dtype=config.dtype, param_dtype=config.dtype, remat=False)
        self.mesh = mesh or make_mesh(MeshConfig(1, 1, 1), jax.local_devices()[:1])
        self.rules = rules
        self.tokenizer = tokenizer
        self.seed = int(seed) & 0xFFFFFFFF
        self.buckets = config.buckets(self.mesh.shape["data"])
        self._param_shardings = param_shardings(self.cfg, self.mesh, rules)
        self._abstract = abstract_params(cfg)
        self._replicated = NamedSharding(self.mesh, PartitionSpec())
        fns = device_functions(self.cfg, config, self.mesh, rules)
        self._prefill, self._start, self._decode = fns.prefill, fns.start, fns.decode
        self.sched = Scheduler(config, self.buckets, tokenizer.decode if tokenizer is not None else None)
        self.params = self._place(params)
        with activate(self.mesh, rules):
            self.pool = make_pool(self.cfg, config.num_blocks, config.block_size, self.cfg.compute_dtype, self.mesh,
                                  rules)
        self.state = jax.device_put(init_state(self.sched.rows, config.stop_seq_len), self._replicated)
        self._init_driver()

    def _init_driver(self) -> None:
        """The host side's state of the device loop: request ids, the lock, the inbox, the driver thread, peaks."""
        self._rid = itertools.count()
        self._lock = threading.RLock()  # guards scheduler, params, pool, state between device rounds
        self._inbox: queue.SimpleQueue = queue.SimpleQueue()
        self._wake = threading.Event()
        self._thread: threading.Thread | None = None
        self._closed = False
        self._error: BaseException | None = None
        self.peak_referenced_blocks = 0
        self.peak_waiting = 0
        self.clock = DeviceClock()
        self._snapshot: dict | None = None   # stats at the end of the driver's last round (last_stats)

    # ---------------------------------------------------------------------------------------------------- weights
    def _place(self, params, owned: bool = False):
        want = jax.tree.structure(self._abstract)
        if jax.tree.structure(params) != want:
            raise ValueError(f"params do not match the model's parameter tree: got {jax.tree.structure(params)}, "
                             f"want {want}")
        for (path, a), b in zip(jax.tree_util.tree_flatten_with_path(params)[0], jax.tree.leaves(self._abstract)):
            if tuple(a.shape) != tuple(b.shape):
                raise ValueError(f"param {jax.tree_util.keystr(path)} has shape {a.shape}, the model needs {b.shape}")
        dt = self.cfg.compute_dtype
        # Cast where the weights are (each shard locally, halving what moves), then reshard onto the sampler mesh.
        cast = jax.tree.map(lambda x: x.astype(dt) if x.dtype != dt else x, params)
        # Never alias the caller's buffers (unless they are ``owned``: fresh from the publish): the trainer donates
        # its state to the next step, which would delete weights the engine still samples with (same dtype and
        # layout, e.g. fp32 on one CPU device).
        return jax.device_put(cast, self._param_shardings, may_alias=owned)

    def load_weights(self, params, *, owned: bool = False) -> int:
        """Installs new policy weights (on-device cast to the sampler dtype and reshard); returns the new version.
        ``owned``: the arrays are the engine's to keep (already cast and on its device: no copy is made).

        Takes effect at the next device round; the prefix cache is emptied (old K/V belong to old weights).
        Tokens of turns admitted before the swap keep reporting the version they were admitted under.
        """
        new = self._place(params, owned)
        with self._lock:
            self.params = new
            self.sched.new_weights()
            return self.sched.version

    @property
    def alive(self) -> bool:
        """Returns whether the engine takes requests: not closed, and its driver (once started) has not failed."""
        return self._error is None and not self._closed and (self._thread is None or self._thread.is_alive())

    @property
    def version(self) -> int:
        """The policy version tagging newly admitted turns."""
        return self.sched.version

    # ---------------------------------------------------------------------------------------------------- API
    async def generate(self, prompt_ids: Sequence[int], params: SamplingParams | None = None,
                       key: jax.Array | None = None, *, on_progress: Any = None) -> GenerationResult:
        """Returns the finished turn for ``prompt_ids``; raises ValueError/TypeError for a bad request.

        ``key`` (a ``jax.random`` key) makes the turn reproducible: token i is drawn with ``fold_in(key, i)``,
        whatever else shares the batch. Without one, the engine derives (seed, request counter).
        ``on_progress(token_ids, logprobs)`` (optional) is called on the caller's event loop after each device round
        that added tokens to the still-running turn (for streaming): those tokens are final, a stop string never cuts
        them. A turn whose params ask for ``top_logprobs`` gets them as a third argument.
        """
        if self._error is not None:
            raise EngineError("the engine's driver failed") from self._error
        if self._closed:
            raise EngineError("the engine is closed")
        params = SamplingParams() if params is None else params
        rid = next(self._rid)
        c = self.config
        req = make_request(rid, prompt_ids, params, key, vocab_size=self.cfg.vocab_size, max_context=c.max_context,
                           max_stop_ids=c.max_stop_ids, block_size=c.block_size,
                           capacity_blocks=self.sched.blocks.capacity, has_tokenizer=self.tokenizer is not None,
                           fallback_key=(self.seed, rid & 0xFFFFFFFF), max_top_logprobs=c.top_logprobs)
        loop = asyncio.get_running_loop()
        req.future, req.loop, req.on_progress = loop.create_future(), loop, on_progress
        self._submit(("add", req))
        try:
            return await req.future
        except asyncio.CancelledError:
            self._submit(("cancel", req))
            raise

    def _submit(self, msg) -> None:
        self._inbox.put(msg)
        if self._thread is None:
            with self._lock:
                if self._thread is None:
                    self._thread = threading.Thread(target=self._drive, name="sera-engine-driver", daemon=True)
                    self._thread.start()
        self._wake.set()

    def close(self) -> None:
        """Stops the driver; pending turns fail with EngineError."""
        self._closed = True
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout=30)
        self.clock.close()

    # ---------------------------------------------------------------------------------------------------- driver
    def _drive(self) -> None:
        pending: list[tuple] = []  # dispatched last round, not parsed yet
        try:
            with activate(self.mesh, self.rules):
                while not self._closed:
                    with self._lock:
                        finished = []
                        if not self.config.dispatch_ahead:
                            # Wait for the last round and parse it first: its finished rows free their slots and
                            # the turns that arrived meanwhile are admitted into the very next round.
                            for rec in pending:
                                finished += self._parse(rec)
                            pending = []
                        self._drain_inbox()
                        dispatched = self._dispatch_round()
                        for rec in pending:
                            finished += self._parse(rec)
                        pending = dispatched
                        self._track()
                        progress = self._progress()
                    for req, result in finished:
                        _resolve(req, result)
                    for req, *told in progress:
                        _notify(req, *told)
                    if not dispatched and not pending and not self._inbox.qsize():
                        self._wake.wait(timeout=1.0)
                        self._wake.clear()
        except BaseException as e:  # noqa: BLE001  (a driver failure must reach every waiting coroutine)
            self._error = e
        with self._lock:
            err = EngineError("the engine's driver failed" if self._error else "the engine was closed")
            if self._error is not None:
                err.__cause__ = self._error
            for req in list(self.sched.waiting) + self.sched.live():
                _resolve(req, err)

    def _drain_inbox(self) -> None:
        while True:
            try:
                kind, req = self._inbox.get_nowait()
            except queue.Empty:
                return
            if kind == "add" and not req.cancelled:
                self.sched.add(req)
            elif kind == "cancel":
                self.sched.cancel(req)

    def _dispatch_round(self) -> list[tuple]:
        t0, compiling0 = time.monotonic(), compile_watch.thread_seconds()
        out = []
        for _ in range(self.config.prefill_calls):
            pb = self.sched.plan_prefill()
            if pb is None:
                break
            self.pool, logits = self._prefill(self.params, self.pool, pb.tokens, pb.ctx_len, pb.new_len, pb.table,
                                              pb.ctx_table)
            self.state, tok, lp, ended, ti, tl = self._start(self.state, logits, pb.ctx_len, pb.new_len, pb.slot,
                                                             pb.rows)
            self.sched.prefill_dispatched(pb)
            out.append(("prefill", pb, tok, lp, ti, tl, ended))
        for db in self.sched.plan_decode():
            self.pool, self.state, ot, ol, ti, tl = self._decode(self.params, self.pool, self.state, db.index,
                                                                 db.table, db.alive, db.rows)
            out.append(("decode", db, ot, ol, ti, tl))
        if out:
            self.clock.dispatched(t0, [x for rec in out for x in rec[2:]],
                                  compile_s=compile_watch.thread_seconds() - compiling0)
        return out

    def _parse(self, rec) -> list:
        kind, batch, a, b, ti, tl, *rest = rec
        a, b = np.asarray(a), np.asarray(b)
        top = (np.asarray(ti), np.asarray(tl)) if self.config.top_logprobs else None
        if kind == "prefill":
            return self.sched.on_prefill_output(batch, a, b, np.asarray(rest[0]), top=top)
        return self.sched.on_decode_output(batch, a, b, top=top)

    def _progress(self) -> list[tuple]:
        """Returns (request, tokens, logprobs[, top logprobs]) of the live streamed turns that grew since they were
        last told (the top logprobs for turns that asked for them)."""
        out = []
        for req in self.sched.live():
            if req.on_progress is not None and not req.finished and len(req.tokens) > req.reported:
                req.reported = len(req.tokens)
                told = (req, tuple(req.tokens), tuple(req.logprobs))
                out.append(told + (tuple(req.top_logprobs),) if req.params.top_logprobs else told)
        return out

    def _track(self) -> None:
        self.peak_referenced_blocks = max(self.peak_referenced_blocks, self.sched.blocks.num_referenced())
        self.peak_waiting = max(self.peak_waiting, len(self.sched.waiting))
        self._snapshot = self._collect()

    # ---------------------------------------------------------------------------------------------------- shapes
    def warmup(self) -> int:
        """Compiles every bucketed prefill and decode shape now (engine must be idle); returns new compilations."""
        before = self.compile_count()
        with self._lock, activate(self.mesh, self.rules):
            if self.sched.has_work():
                raise RuntimeError("warmup() needs an idle engine (it runs padding-only device calls)")
            c, bk, rows = self.config, self.buckets, self.sched.row_cfg
            w_max = c.max_blocks_per_seq
            for b, t, cb in itertools.product(bk["prefill_batch"], bk["prefill_len"], bk["prefill_ctx"]):
                if b > bk["prefill_batch"][0] and b * t > c.max_prefill_tokens:
                    continue
                rc = {k: np.zeros((b,) + v.shape[1:], v.dtype) for k, v in rows.items()}
                self.pool, logits = self._prefill(
                    self.params, self.pool, np.zeros((b, t), np.int32), np.zeros(b, np.int32), np.ones(b, np.int32),
                    np.zeros((b, w_max), np.int32), np.zeros((b, cb), np.int32))
                self.state, *_ = self._start(self.state, logits, np.zeros(b, np.int32), np.ones(b, np.int32),
                                             np.full(b, self.sched.rows, np.int32), rc)
            for b in bk["batch"]:
                for w in bk["width"]:
                    rc = {k: v[:b].copy() for k, v in rows.items()}
                    self.pool, self.state, *_ = self._decode(
                        self.params, self.pool, self.state, np.full(b, self.sched.rows, np.int32),
                        np.zeros((b, w), np.int32), np.zeros(b, bool), rc)
            jax.block_until_ready(self.state)
        return self.compile_count() - before

    def warm_publish(self, params) -> None:
        """Runs the cast and copy ``load_weights`` does, without installing the result (warm-up: their programs
        are compiled before the first real publish)."""
        jax.block_until_ready(self._place(params))

    def compile_count(self) -> int:
        """Returns how many executables the engine's device functions have compiled so far."""
        return self._prefill._cache_size() + self._start._cache_size() + self._decode._cache_size()

    def stats(self) -> dict[str, int]:
        """Returns counters: prefill/cached/generated tokens, calls, finish reasons, and block usage now and at peak."""
        with self._lock:
            return self._collect()

    def last_stats(self) -> dict[str, int]:
        """Returns ``stats()`` as of the end of the driver's last round, without taking the engine's lock: a busy
        driver re-takes it at once after every round, so a monitor (``sera-serve``'s /metrics) could wait on it until
        the batch drains."""
        snap = self._snapshot
        return dict(snap) if snap is not None else self.stats()

    def _collect(self) -> dict[str, int]:
        s = {k: 0 for k in ("admitted", "prefill_tokens", "cached_tokens", "generated_tokens", "prefill_calls",
                            "decode_calls", "decode_live_rows", "decode_batch_rows", "cancelled")}
        s.update(self.sched.stats)
        blocks = self.sched.blocks
        s.update(blocks_total=blocks.capacity, blocks_referenced=blocks.num_referenced(),
                 blocks_cached=blocks.num_cached(), blocks_available=blocks.num_available(),
                 peak_referenced_blocks=self.peak_referenced_blocks, peak_waiting=self.peak_waiting,
                 waiting=len(self.sched.waiting), running=len(self.sched.live()), evictions=blocks.evictions,
                 version=self.sched.version, compiles=self.compile_count())
        s["device_busy_s"] = self.clock.busy_s()
        return s


def _notify(req: Request, *told: tuple) -> None:
    """Hands a live turn's tokens so far (with their logprobs, and top logprobs when asked for) to its
    ``on_progress`` on the request's event loop, from the driver."""
    try:
        req.loop.call_soon_threadsafe(req.on_progress, *told)
    except RuntimeError:  # the caller's loop is closed: nobody is listening any more
        pass


def _resolve(req: Request, outcome) -> None:
    """Hands a result (or exception) to the request's event loop, from the driver thread."""
    fut, loop = req.future, req.loop
    if fut is None or loop is None:
        return

    def settle():
        if fut.done():
            return
        if isinstance(outcome, BaseException):
            fut.set_exception(outcome)
        else:
            fut.set_result(outcome)

    try:
        loop.call_soon_threadsafe(settle)
    except RuntimeError:  # the caller's loop is closed: nobody is waiting any more
        pass
