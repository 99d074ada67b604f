"""Continuous batching on the host: admission within the block budget, batch building, output parsing, retirement.

Pure host logic over numpy arrays and ``BlockManager``; the engine's driver calls it between device calls and does
the dispatching. The decode batch has ``rows`` slots; a request holds one slot from admission to retirement.

Admission (FIFO, between decode chunks). A waiting request is admitted when a slot is free and the pool can give it
every block it may ever need: its prompt (minus the cached prefix) plus ``max_new`` tokens. Reserving the worst
case up front means a running sequence never runs out of memory mid-turn (no preemption needed); a request that
does not fit waits, and the queue stays in order. A request whose prefix is being computed by this very round waits
one round (``BlockManager`` pending blocks) and then reuses it instead of computing it twice.

Pipelining. The driver may dispatch call k+1 before parsing call k (``EngineConfig.dispatch_ahead``; by default it
parses first), so results are matched to requests through the slot snapshot taken at dispatch, and a row the host
retired may still produce tokens for one more chunk: they are dropped. Device calls run in dispatch order and the pool threads through all of them, so a block freed here is
reused only by calls that run after every in-flight write to it.
"""

from __future__ import annotations

import collections
import dataclasses
import math
from typing import Callable, Sequence

import numpy as np

from sera_jax.sampling.block_manager import BlockManager, chain_digests
from sera_jax.sampling.engine_config import EngineConfig, pick_bucket
from sera_jax.sampling.request import Request, find_stop_string
from sera_jax.sampling.types import GenerationResult


@dataclasses.dataclass
class PrefillBatch:
    """One prefill call: arrays for ``device_loop.prefill`` and, per real row, (request, is its last piece)."""

    tokens: np.ndarray
    ctx_len: np.ndarray
    new_len: np.ndarray
    table: np.ndarray
    ctx_table: np.ndarray  # the first C entries of ``table``: the cached blocks the attention reads
    slot: np.ndarray
    rows: dict[str, np.ndarray]
    members: list[tuple[Request, bool]]


@dataclasses.dataclass
class DecodeBatch:
    """One decode chunk: ``b`` engine rows (``index``; padding = out of range), table width ``W``, and the
    row → request snapshot."""

    index: np.ndarray
    table: np.ndarray
    alive: np.ndarray
    rows: dict[str, np.ndarray]
    snapshot: list[Request | None]


# The decode split's cost model, in units of one row's table block: a row costs its width plus DECODE_ROW_BLOCKS (its
# matmuls), a call DECODE_CALL_COST more (dispatch and loop overhead). Fitted loosely to the tiny policy on CPU
# (per step: ~0.28 ms a call, ~20 us a row, ~2.5 us a row's block).
DECODE_ROW_BLOCKS = 8
DECODE_CALL_COST = 96


class Scheduler:
    """Host state of the decode batch. Finished turns come back as (request, GenerationResult) pairs."""

    def __init__(self, config: EngineConfig, buckets: dict[str, tuple[int, ...]],
                 decode_fn: Callable[[Sequence[int]], str] | None = None):
        self.config, self.buckets, self.decode = config, buckets, decode_fn
        self.rows = buckets["batch"][-1]
        self.max_live = min(config.max_batch, self.rows)
        self.blocks = BlockManager(config.num_blocks, config.block_size)
        self.waiting: collections.deque[Request] = collections.deque()
        self.slots: list[Request | None] = [None] * self.rows
        w, s = config.max_blocks_per_seq, config.max_stop_ids
        self.table = np.zeros((self.rows, w), np.int32)
        self.row_cfg = {"temperature": np.zeros(self.rows, np.float32), "top_p": np.ones(self.rows, np.float32),
                        "key": np.zeros((self.rows, 2), np.uint32), "stop_ids": np.full((self.rows, s), -1, np.int32),
                        "max_new": np.ones(self.rows, np.int32),
                        "stop_seqs": np.full((self.rows, config.max_stop_seqs, config.stop_seq_len), -1, np.int32)}
        # Token sequences seen to complete each stop string (learned from the host's own detection, so they are the
        # tokenizations the model actually produces): rows carry them and stop on device, a round earlier than the
        # host could tell them to, and without decoding past the stop.
        self.stop_seqs: dict[str, list[tuple[int, ...]]] = {}
        self.version = 0
        self.stats = collections.Counter()

    # ------------------------------------------------------------------------------------------------------------
    def live(self) -> list[Request]:
        return [r for r in self.slots if r is not None]

    def has_work(self) -> bool:
        return bool(self.waiting) or any(r is not None for r in self.slots)

    def add(self, req: Request) -> None:
        self.waiting.append(req)

    def cancel(self, req: Request) -> bool:
        """Drops a waiting or running request, freeing its slot and every block it held; returns whether it was here."""
        if req.finished:
            return False
        req.cancelled = True
        if req in self.waiting:
            self.waiting.remove(req)
            req.finished = True
            self.stats["cancelled"] += 1
            return True
        if req.slot >= 0:
            self._retire(req, register=False)
            self.stats["cancelled"] += 1
            return True
        return False

    # ------------------------------------------------------------------------------------------------------------
    def _admit_one(self, req: Request) -> str:
        """Tries to give ``req`` a slot and blocks: returns "ok", "defer" (pending prefix) or "full"."""
        bs = self.config.block_size
        free_slots = [i for i in range(self.max_live) if self.slots[i] is None]
        if not free_slots:
            return "full"
        p = len(req.prompt)
        req.prompt_digests = chain_digests(req.prompt, bs)
        # The block holding the last prompt token is never shared: its logits must be computed.
        shareable = req.prompt_digests[: (p - 1) // bs] if self.config.prefix_caching else []
        shared, pending = self.blocks.match(shareable)
        if pending:
            return "defer"
        total = math.ceil((p + req.max_new - 1) / bs)
        self.blocks.acquire(shared)
        fresh = self.blocks.allocate(total - len(shared))
        if fresh is None:
            self.blocks.release(shared)
            return "full"
        req.blocks = shared + fresh
        req.cached_tokens = req.prefilled = len(shared) * bs
        # Index this prompt's own full blocks now (pending), so identical prompts in flight share them.
        n_full = p // bs if self.config.prefix_caching else 0
        self.blocks.register(req.blocks[len(shared):n_full], req.prompt_digests[len(shared):n_full], ready=False)
        req.slot = free_slots[0]
        req.version = self.version
        self.slots[req.slot] = req
        self.table[req.slot] = 0
        self.table[req.slot, : len(req.blocks)] = req.blocks
        cfg = self.row_cfg
        cfg["temperature"][req.slot] = req.params.temperature
        cfg["top_p"][req.slot] = req.params.top_p
        cfg["key"][req.slot] = req.key_data
        cfg["stop_ids"][req.slot] = req.stop_ids
        cfg["max_new"][req.slot] = req.max_new
        cfg["stop_seqs"][req.slot] = -1
        seqs = [q for st in req.params.stop_strings for q in self.stop_seqs.get(st, ())][: self.config.max_stop_seqs]
        for i, q in enumerate(seqs):
            cfg["stop_seqs"][req.slot, i, -len(q):] = q
        self.stats["admitted"] += 1
        self.stats["cached_tokens"] += req.cached_tokens
        return "ok"

    def plan_prefill(self) -> PrefillBatch | None:
        """Admits what fits and returns the next prefill call (continuing pieces first), or None if none is due."""
        cfg = self.config
        group: list[tuple[Request, int]] = []  # (request, tokens of this piece)
        longest = 0

        def fits(n_tokens: int) -> bool:
            t = pick_bucket(self.buckets["prefill_len"], max(longest, n_tokens))
            b = pick_bucket(self.buckets["prefill_batch"], len(group) + 1)
            return not group or (len(group) < cfg.max_prefill_batch and b * t <= cfg.max_prefill_tokens)

        def piece(req: Request) -> int:
            return min(len(req.prompt) - req.prefilled, cfg.max_prefill_len)

        for req in self.live():
            if not req.decoding and req.prefilled < len(req.prompt) and fits(piece(req)):
                group.append((req, piece(req)))
                longest = max(longest, piece(req))
        deferred = []
        while self.waiting and len(group) < cfg.max_prefill_batch:
            req = self.waiting[0]
            status = self._admit_one(req) if fits(min(len(req.prompt), cfg.max_prefill_len)) else "full"
            if status == "full":
                break
            self.waiting.popleft()
            if status == "defer":
                deferred.append(req)
                continue
            group.append((req, piece(req)))
            longest = max(longest, piece(req))
        self.waiting.extendleft(reversed(deferred))
        if not group:
            return None
        b = pick_bucket(self.buckets["prefill_batch"], len(group))
        t = pick_bucket(self.buckets["prefill_len"], longest)
        w = self.table.shape[1]
        c = pick_bucket(self.buckets["prefill_ctx"], max(math.ceil(r.prefilled / cfg.block_size) for r, _ in group))
        batch = PrefillBatch(tokens=np.zeros((b, t), np.int32), ctx_len=np.zeros(b, np.int32),
                             new_len=np.ones(b, np.int32), table=np.zeros((b, w), np.int32), ctx_table=None,
                             slot=np.full(b, self.rows, np.int32),
                             rows={k: np.zeros((b,) + v.shape[1:], v.dtype) for k, v in self.row_cfg.items()},
                             members=[])
        batch.rows["stop_ids"][:] = -1
        for i, (req, n) in enumerate(group):
            last = req.prefilled + n == len(req.prompt)
            batch.tokens[i, :n] = req.prompt[req.prefilled:req.prefilled + n]
            batch.ctx_len[i], batch.new_len[i] = req.prefilled, n
            batch.table[i] = self.table[req.slot]
            if last:  # only the last piece samples a token and sets the decode row
                batch.slot[i] = req.slot
            for k in batch.rows:
                batch.rows[k][i] = self.row_cfg[k][req.slot]
            batch.members.append((req, last))
        batch.ctx_table = np.ascontiguousarray(batch.table[:, :c])
        return batch

    def prefill_dispatched(self, batch: PrefillBatch) -> None:
        """Records that ``batch`` was dispatched: progress, readiness of the blocks it computes, decode eligibility."""
        for i, (req, last) in enumerate(batch.members):
            req.prefilled += int(batch.new_len[i])
            self.stats["prefill_tokens"] += int(batch.new_len[i])
            if last:
                req.decoding = True
                req.ub_len = len(req.prompt)
                self.blocks.mark_ready(req.blocks[: len(req.prompt) // self.config.block_size])
        self.stats["prefill_calls"] += 1

    def plan_decode(self) -> list[DecodeBatch]:
        """Returns the next round's decode chunks over all decoding rows (none if no row is decoding).

        Rows are grouped by the table width they need (up to ``config.decode_groups`` groups, split where the
        modelled cost, rows × (width + a per-row constant) plus a per-call constant, is least), so rows with short
        contexts do not pay for the longest one's width: on the reference backend a decode step's cost is mostly
        reading each row's whole window.
        """
        bs, steps = self.config.block_size, self.config.chunk_steps
        decoding = [r for r in self.live() if r.decoding]
        if not decoding:
            return []
        need = {}
        for r in decoding:
            cap = len(r.prompt) + r.max_new - 1  # the last token's K/V is never written
            need[r.slot] = max(1, math.ceil(min(r.ub_len + steps, cap) / bs))
            r.ub_len = min(r.ub_len + steps, cap)
        order = sorted(need, key=lambda slot: (need[slot], slot))
        return [self._decode_batch(g, pick_bucket(self.buckets["width"], max(need[i] for i in g)))
                for g in self._split(order, need)]

    def chunk_cost(self, slots: list[int], need: dict[int, int]) -> int:
        """Returns the modelled cost of one decode chunk over ``slots`` (sorted by needed blocks), in row-blocks."""
        b = pick_bucket(self.buckets["batch"], len(slots))
        return b * (pick_bucket(self.buckets["width"], need[slots[-1]]) + DECODE_ROW_BLOCKS) + DECODE_CALL_COST

    def _split(self, order: list[int], need: dict[int, int]) -> list[list[int]]:
        """Returns ``order`` (slots by needed blocks) cut into ≤ ``decode_groups`` consecutive groups of least modelled
        cost (an exact dynamic programme over the cut points: at most ``rows`` × ``decode_groups`` states)."""
        n, k_max = len(order), self.config.decode_groups
        # best[k][j]: (cost, cut points) of order[:j] in k groups.
        best = [{0: (0, ())}]
        for k in range(1, k_max + 1):
            row = {}
            for j in range(1, n + 1):
                options = [(c + self.chunk_cost(order[i:j], need), cuts + (i,))
                           for i, (c, cuts) in best[k - 1].items() if i < j]
                if options:
                    row[j] = min(options)
            best.append(row)
        _, cuts = min(best[k][n] for k in range(1, k_max + 1) if n in best[k])
        bounds = list(cuts) + [n]
        return [order[bounds[i]:bounds[i + 1]] for i in range(len(cuts))]

    def _decode_batch(self, slots: list[int], w: int) -> DecodeBatch:
        b = pick_bucket(self.buckets["batch"], len(slots))
        index = np.full(b, self.rows, np.int32)
        index[: len(slots)] = slots
        clipped = np.minimum(index, self.rows - 1)
        alive = index < self.rows
        table = np.where(alive[:, None], self.table[clipped, :w], 0).astype(np.int32)
        rows = {k: v[clipped] for k, v in self.row_cfg.items()}
        self.stats["decode_calls"] += 1
        self.stats["decode_live_rows"] += len(slots)   # rows that decode, of the b rows the chunk computes
        self.stats["decode_batch_rows"] += b
        return DecodeBatch(index=index, table=table, alive=alive, rows=rows,
                           snapshot=[self.slots[i] if i < self.rows else None for i in index])

    # ------------------------------------------------------------------------------------------------------------
    def on_prefill_output(self, batch: PrefillBatch, tok: np.ndarray, lp: np.ndarray,
                          ended: np.ndarray | None = None, top: tuple[np.ndarray, np.ndarray] | None = None):
        """Parses a prefill call's first tokens (``ended``: the device finished the row; ``top``: the top ids and
        logprobs [B, k], when the engine computes them); returns the (request, result) pairs that finished."""
        done = []
        for i, (req, last) in enumerate(batch.members):
            if last and not req.finished:
                tops = _tops(top[0][i:i + 1], top[1][i:i + 1], req) if top is not None else None
                self._append(req, [int(tok[i])], [float(lp[i])], done, ended=ended is not None and bool(ended[i]),
                             tops=tops)
        return done

    def on_decode_output(self, batch: DecodeBatch, out_tok: np.ndarray, out_lp: np.ndarray,
                         top: tuple[np.ndarray, np.ndarray] | None = None):
        """Parses a decode chunk (``top``: the top ids and logprobs [B, steps, k], when the engine computes them);
        returns the (request, result) pairs that finished."""
        done = []
        for i, req in enumerate(batch.snapshot):
            if req is None or req.finished or not batch.alive[i]:
                continue
            valid = out_tok[i] >= 0
            n = int(np.argmin(valid)) if not valid.all() else len(valid)
            # Fewer tokens than the chunk's steps (none included: the row ended on the last step of an earlier
            # chunk): the device finished the row, and the row must retire here or it would wait forever.
            tops = _tops(top[0][i, :n], top[1][i, :n], req) if top is not None else None
            self._append(req, out_tok[i, :n].tolist(), out_lp[i, :n].tolist(), done, ended=n < len(valid), tops=tops)
        return done

    def _learn_stop(self, req: Request, n: int) -> None:
        """Records the shortest token suffix of ``req.tokens[:n]`` that completes one of its stop strings."""
        cap, longest = self.config.max_stop_seqs, self.config.stop_seq_len
        for st in req.params.stop_strings:
            known = self.stop_seqs.setdefault(st, [])
            if len(known) >= cap:
                continue
            for k in range(1, min(longest, n) + 1):
                if st in self.decode(req.tokens[n - k:n]):
                    seq = tuple(req.tokens[n - k:n])
                    if seq not in known:
                        known.append(seq)
                    break

    def _append(self, req: Request, toks: list[int], lps: list[float], done: list, ended: bool = False,
                tops: list | None = None) -> None:
        stops = set(int(s) for s in req.stop_ids if s >= 0)
        reason = None
        for j, (t, l) in enumerate(zip(toks, lps)):
            req.tokens.append(t)
            req.logprobs.append(l)
            if tops is not None:
                req.top_logprobs.append(tops[j])
            if t in stops:
                reason = "stop_id"
                break
            if len(req.tokens) >= req.max_new:
                reason = "length"
                break
        if req.params.stop_strings:
            n = find_stop_string(self.decode, req.tokens, req.params.stop_strings, req.text_checked)
            if n is not None:
                self._learn_stop(req, n)
                del req.tokens[n:], req.logprobs[n:], req.top_logprobs[n:]
                reason = "stop_string"
            req.text_checked = len(req.tokens)
        if reason is None and ended:
            # The device ended the row on a learned stop sequence whose text the host did not find again (a
            # tokenisation that decodes differently in context): the row can produce nothing more, so it ends here.
            reason = "stop_string"
            self.stats["stop_unconfirmed"] += 1
        self.stats["generated_tokens"] += len(toks)
        if reason is not None:
            done.append((req, self._retire(req, register=True, reason=reason)))

    def _retire(self, req: Request, register: bool, reason: str = "cancelled") -> GenerationResult:
        """Frees ``req``'s slot and blocks (indexing its computed full blocks first); returns its result."""
        req.finished = True
        if register and req.decoding and self.config.prefix_caching:
            # K/V exist for the prompt and every kept generated token but the last.
            seq = req.prompt + req.tokens[:-1]
            n_full = len(seq) // self.config.block_size
            self.blocks.register(req.blocks[:n_full], chain_digests(seq, self.config.block_size, n_full), ready=True)
        elif not req.decoding:
            self.blocks.unindex_pending(req.blocks)  # cancelled before its prompt was computed
        self.blocks.release(req.blocks)
        req.blocks = []
        if req.slot >= 0:
            self.slots[req.slot] = None
            self.table[req.slot] = 0
            req.slot = -1
        self.stats["finished_" + reason] += 1
        return req.result(reason)

    def new_weights(self) -> None:
        """New policy weights: every cached prefix is stale, so the prefix index is emptied; the version bumps."""
        self.blocks.clear_index()
        self.version += 1


def _tops(ids_SK: np.ndarray, lps_SK: np.ndarray, req: Request) -> list | None:
    """Returns the request's top logprobs per position, ((id, logprob), ...) of its asked-for k, or None when it
    asked for none."""
    k = req.params.top_logprobs
    if not k:
        return None
    return [tuple(zip(ids[:k].tolist(), lps[:k].tolist())) for ids, lps in zip(ids_SK, lps_SK)]
