"""The engine's pure device functions: prefill past a cached prefix, sample the prefilled rows' first tokens, and
decode a chunk inside one ``while_loop``.

Each takes (params, pool and/or row state, batch arrays) and returns new values; nothing is hidden in closures except
the static model config and block size. The row state is the part of the batch that lives on device between chunks, so
the host can dispatch the next chunk before it has read the previous one: a ``RowState`` pytree (token, len,
n_gen, done; [R] each).

``R`` is the engine's maximum batch; a decode chunk works on ``b`` of them (a batch bucket), picked by index. Per-row sampling
settings are sent with every call (``RowConfig``): they are tiny and keep the device state minimal.
"""

from __future__ import annotations

from typing import Any

import flax.struct
import jax
import jax.numpy as jnp
from jaxtyping import Array, Bool, Float, Int

from sera_jax.model.config import Qwen3Config
from sera_jax.model.qwen3 import DecoderLayer, Qwen3, rope_tables
from sera_jax.sampling.attention import (
    append_window,
    gather_window,
    paged_attention,
    select_impl,
    window_decode_attention,
)
from sera_jax.sampling.paged_cache import Pool, write_kv, write_slots
from sera_jax.sampling.sample import sample_tokens, top_logprobs


@flax.struct.dataclass
class RowState:
    """The part of the batch that lives on device between chunks, one entry per engine row [R]."""

    token: Int[Array, "R"]   # last sampled token, not yet in the cache
    len: Int[Array, "R"]     # tokens whose K/V are in the pool
    n_gen: Int[Array, "R"]   # tokens generated so far
    done: Bool[Array, "R"]   # finished (or an empty row)
    recent: Int[Array, "R L"]  # the last L generated tokens, oldest first (-1 before the first): stop sequences

    def set_rows(self, index, new: "RowState", **kw) -> "RowState":
        """Returns the state with rows ``index`` replaced by ``new`` (``kw``: ``.at[].set`` options, e.g. mode)."""
        return jax.tree.map(lambda old, n: old.at[index].set(n, **kw), self, new)

# {"temperature": [b] f32, "top_p": [b] f32, "key": [b, 2] uint32, "stop_ids": [b, S] int32 (-1 pads),
#  "max_new": [b] int32, "stop_seqs": [b, Q, L] int32 (token sequences right-aligned, -1 pads)}
RowConfig = dict[str, jax.Array]

# The reference decode gathers a chunk's context once into a dense window (see attention.py) when the window of all
# layers, keys and values, fits in this many bytes; past it (huge contexts) it gathers per layer per step instead.
MAX_WINDOW_BYTES = 1 << 30


def init_state(rows: int, recent_len: int = 8) -> RowState:
    """Returns an all-finished row state for ``rows`` rows, remembering ``recent_len`` tokens each."""
    # Distinct buffers: the engine donates the state, and one buffer may not be donated twice.
    return RowState(token=jnp.zeros((rows,), jnp.int32), len=jnp.zeros((rows,), jnp.int32),
                    n_gen=jnp.zeros((rows,), jnp.int32), done=jnp.ones((rows,), bool),
                    recent=jnp.full((rows, recent_len), -1, jnp.int32))


def _paged_attention_fn(q, k, v, layer, aux):
    # The per-layer "cache" scanned in is just the layer index; the new k/v go out as the scan's per-layer output
    # and are written into the pool once, after the trunk (see write_kv).
    # The Pallas kernel on GPU, the pure-JAX reference elsewhere ($SERA_ATTENTION_IMPL overrides).
    out = select_impl()(q, k, v, aux["k_pool"], aux["v_pool"], layer, aux["table"], aux["ctx_len"])
    return out, {"k": k, "v": v}


def run_model(params, cfg: Qwen3Config, pool: Pool, tokens_BT: Int[Array, "B T"], positions_BT: Int[Array, "B T"],
              table_BW: Int[Array, "B W"], ctx_len_B: Int[Array, "B"]):
    """Returns (hidden [B, T, D], unembed [D, V], new {"k","v"} [L, B, T, K, E]) of new tokens over the paged cache."""
    aux = {"k_pool": pool["k"], "v_pool": pool["v"], "table": table_BW, "ctx_len": ctx_len_B}
    layers = jnp.arange(cfg.num_layers, dtype=jnp.int32)
    return Qwen3(cfg, _paged_attention_fn).apply({"params": params}, tokens_BT, positions_BT, layers, aux,
                                                 method=Qwen3.trunk_and_unembed)


def _window_attention_fn(q, k, v, window, aux):
    # The layer's "cache" is its dense window: append the new k/v (in place), then attend over len + 1 columns.
    k_win, v_win = append_window(window["k"], window["v"], k, v, aux["pos"])
    out = window_decode_attention(q, k_win, v_win, aux["len"] + 1)
    return out, {"k": k_win, "v": v_win, "new_k": k, "new_v": v}


def _embed(module: Qwen3, tokens):
    return module.embed(tokens).astype(module.cfg.compute_dtype)


def _head(module: Qwen3, x):
    return module.final_norm(x), module.unembed_matrix()


def split_layers(params, num_layers: int) -> list:
    """Returns one parameter tree per decoder layer (the layer axis sliced off ``params["layers"]``)."""
    return [jax.tree.map(lambda p, i=i: p[i], params["layers"]) for i in range(num_layers)]


def run_model_window(params, layers: list, cfg: Qwen3Config, windows: list[dict[str, jax.Array]],
                     tokens_B1: Int[Array, "B 1"], len_B: Int[Array, "B"], write_B: Int[Array, "B"]):
    """Returns (hidden [B, 1, D], unembed [D, V], per layer {"k", "v": the window with the new token written at
    column ``write`` (out of range: not written), "new_k", "new_v": [B, 1, K, E]}) of one decode step over per-layer
    dense windows ({"k": [B, K, E, W], "v": [B, K, W, E]} from ``gather_window``) of ``len`` tokens each.

    The same computation as ``Qwen3.trunk_and_unembed`` (its own modules, applied layer by layer), but unrolled over
    layers with the per-layer weights (``split_layers``) sliced once per chunk: under the model's layer scan, XLA's
    CPU backend copies every layer's weights and window out of the stacked arrays at every step.
    """
    model = Qwen3(cfg, _window_attention_fn)
    x = model.apply({"params": params}, tokens_B1, method=_embed)
    cos, sin = rope_tables(len_B[:, None], cfg.head_dim, cfg.rope_theta)
    layer = DecoderLayer(cfg, _window_attention_fn)
    new = []
    for p, win in zip(layers, windows):
        x, kv = layer.apply({"params": p}, x, win, cos, sin, {"len": len_B, "pos": write_B})
        new.append(kv)
    hidden, unembed = model.apply({"params": params}, x, method=_head)
    return hidden, unembed, new


def uses_window(pool: Pool, b: int, w: int) -> bool:
    """Returns whether ``decode_chunk`` takes the dense-window route for ``b`` rows of ``w`` blocks (static)."""
    l, _, s, kv, e = pool["k"].shape
    nbytes = 2 * l * b * w * s * kv * e * pool["k"].dtype.itemsize
    return select_impl() is paged_attention and nbytes <= MAX_WINDOW_BYTES


def _hits_stop(tokens_B, stop_ids_BS):
    return jnp.any(tokens_B[:, None] == stop_ids_BS, axis=-1)


def _hits_stop_seq(recent_BL, stop_seqs_BQL):
    """Whether each row's last tokens end with one of its stop sequences (right-aligned, -1 pads; all-pad: none)."""
    agree = (stop_seqs_BQL == recent_BL[:, None, :]) | (stop_seqs_BQL < 0)
    real = jnp.any(stop_seqs_BQL >= 0, axis=-1)
    return jnp.any(jnp.all(agree, axis=-1) & real, axis=-1)


def _push(recent_BL, tokens_B):
    return jnp.concatenate([recent_BL[:, 1:], tokens_B[:, None]], axis=1)


def prefill(params, pool: Pool, tokens_BT: Int[Array, "B T"], ctx_len_B: Int[Array, "B"], new_len_B: Int[Array, "B"],
            table_BW: Int[Array, "B W"], ctx_table_BC: Int[Array, "B C"], *, cfg: Qwen3Config, block_size: int):
    """Computes the uncached part of each prompt; returns (pool, the last new token's logits [B, V] fp32).

    Row ``b`` has ``ctx_len[b]`` prompt tokens already in the pool and ``new_len[b]`` (≥ 1) new ones in
    ``tokens[b, :new_len]``. The new tokens' K/V are written through ``table`` (wide enough for ctx + new); the
    attention reads the cached part through ``ctx_table`` (the first ``C`` ≥ ⌈ctx_len / block_size⌉ entries of the
    same tables), so its cost follows the cached context, not the table width (``C = 0``: nothing is cached, no
    cache read at all). Padding rows have an all-zero table (their writes go to the trash block).

    The first token is sampled by ``start_rows``, a separate call: the sampler (top-p sort, threefry draws) was
    ~40% of each prefill shape's compile time on CPU, and one sampler executable serves every prefill shape.
    """
    t = tokens_BT.shape[1]
    positions = ctx_len_B[:, None] + jnp.arange(t, dtype=jnp.int32)[None]
    valid = jnp.arange(t)[None] < new_len_B[:, None]
    hidden, unembed, kv = run_model(params, cfg, pool, tokens_BT, positions, ctx_table_BC, ctx_len_B)
    pool = write_kv(pool, kv["k"], kv["v"], write_slots(table_BW, positions, valid, block_size))
    last = jnp.take_along_axis(hidden, (new_len_B - 1)[:, None, None], axis=1)[:, 0]
    return pool, jnp.einsum("bd,dv->bv", last, unembed, preferred_element_type=jnp.float32)


def start_rows(state: RowState, logits_BV: Float[Array, "B V"], ctx_len_B: Int[Array, "B"], new_len_B: Int[Array, "B"],
               slot_B: Int[Array, "B"], rows: RowConfig, *, top_k: int = 0):
    """Samples each prefilled row's first token from ``prefill``'s logits and resets the state rows ``slot`` to the
    new requests (padding rows and pieces that are not a prompt's last have ``slot`` out of range: dropped).
    Returns (state, first_token [B], first_logprob [B], done [B], top_ids [B, top_k], top_logprobs [B, top_k])."""
    b = logits_BV.shape[0]
    tok, lp = sample_tokens(logits_BV, rows["temperature"], rows["top_p"], rows["key"], jnp.zeros((b,), jnp.int32))
    top_ids, top_lp = top_logprobs(logits_BV, top_k)
    recent = _push(jnp.full((b, state.recent.shape[1]), -1, jnp.int32), tok)
    done = _hits_stop(tok, rows["stop_ids"]) | (rows["max_new"] <= 1) | _hits_stop_seq(recent, rows["stop_seqs"])
    new = RowState(token=tok, len=ctx_len_B + new_len_B, n_gen=jnp.ones((b,), jnp.int32), done=done, recent=recent)
    return state.set_rows(slot_B, new, mode="drop"), tok, lp, done, top_ids, top_lp


def decode_chunk(params, pool: Pool, state: RowState, index_B: Int[Array, "B"], table_BW: Int[Array, "B W"],
                 alive_B: Bool[Array, "B"], rows: RowConfig, *, cfg: Qwen3Config, block_size: int, steps: int,
                 top_k: int = 0):
    """Decodes up to ``steps`` tokens for the engine rows ``index`` (padding: out of range, not alive) in one
    ``lax.while_loop``. The engine may run several chunks a round, each over the rows of one context-length class
    with a table (and so a window) only as wide as that class needs.

    Rows not ``alive`` (retired or cancelled on the host) are finished before the first step. The loop stops early
    once every row is done. On the reference backend the rows' context is gathered once per chunk into a dense
    window that each step appends to (``uses_window``); with the Pallas kernel each step reads the pool. Returns
    (pool, state, tokens [B, steps] (-1 where the row produced nothing), logprobs [B, steps] fp32 at temperature 1,
    top_ids [B, steps, top_k], top_logprobs [B, steps, top_k]: each step's ``top_k`` most likely tokens, for a
    server's ``top_logprobs``; ``top_k`` = 0, the default, computes none).
    """
    b, w = table_BW.shape
    window = uses_window(pool, b, w)
    st = jax.tree.map(lambda v: jnp.take(v, index_B, axis=0, mode="clip"), state)
    done0 = st.done | ~alive_B
    out_tok = jnp.full((b, steps), -1, jnp.int32)
    out_lp = jnp.zeros((b, steps), jnp.float32)
    out_ti = jnp.zeros((b, steps, top_k), jnp.int32)
    out_tl = jnp.zeros((b, steps, top_k), jnp.float32)

    def cond(c):
        return (c[0] < steps) & jnp.any(~c[6])

    def body(c):
        i, pool, win, tok, ln, ng, done, out_tok, out_lp, recent, out_ti, out_tl = c
        active = ~done
        pos = ln[:, None]
        if window:
            out = run_model_window(params, layers, cfg, win, tok[:, None], ln, jnp.where(active, ln, w * block_size))
            hidden, unembed, per_layer = out
            win = [{"k": o["k"], "v": o["v"]} for o in per_layer]
            kv = {name: jnp.stack([o["new_" + name] for o in per_layer]) for name in ("k", "v")}
        else:
            hidden, unembed, kv = run_model(params, cfg, pool, tok[:, None], pos, table_BW, ln)
        pool = write_kv(pool, kv["k"], kv["v"], write_slots(table_BW, pos, active[:, None], block_size))
        logits = jnp.einsum("bd,dv->bv", hidden[:, 0], unembed, preferred_element_type=jnp.float32)
        new, lp = sample_tokens(logits, rows["temperature"], rows["top_p"], rows["key"], ng)
        out_tok = out_tok.at[:, i].set(jnp.where(active, new, -1))
        out_lp = out_lp.at[:, i].set(jnp.where(active, lp, 0.0))
        if top_k:
            ti, tl = top_logprobs(logits, top_k)
            out_ti, out_tl = out_ti.at[:, i].set(ti), out_tl.at[:, i].set(tl)
        step = active.astype(jnp.int32)
        ln, ng = ln + step, ng + step
        recent = jnp.where(active[:, None], _push(recent, new), recent)
        hit = _hits_stop(new, rows["stop_ids"]) | (ng >= rows["max_new"]) | _hits_stop_seq(recent, rows["stop_seqs"])
        done = done | (active & hit)
        return i + 1, pool, win, jnp.where(active, new, tok), ln, ng, done, out_tok, out_lp, recent, out_ti, out_tl

    layers = split_layers(params, cfg.num_layers) if window else []
    win = [dict(zip(("k", "v"), gather_window(pool["k"], pool["v"], i, table_BW))) for i in range(cfg.num_layers)
           ] if window else []
    carry = (jnp.int32(0), pool, win, st.token, st.len, st.n_gen, done0, out_tok, out_lp, st.recent, out_ti, out_tl)
    _, pool, _, tok, ln, ng, done, out_tok, out_lp, recent, out_ti, out_tl = jax.lax.while_loop(cond, body, carry)
    state = state.set_rows(index_B, RowState(token=tok, len=ln, n_gen=ng, done=done, recent=recent), mode="drop")
    return pool, state, out_tok, out_lp, out_ti, out_tl


def row_config_spec(b: int, max_stop_ids: int, max_stop_seqs: int = 2, stop_seq_len: int = 8) -> dict[str, Any]:
    """Returns the shapes/dtypes of a ``RowConfig`` for ``b`` rows (used to build host buffers and warm-up)."""
    return {"temperature": ((b,), jnp.float32), "top_p": ((b,), jnp.float32), "key": ((b, 2), jnp.uint32),
            "stop_ids": ((b, max_stop_ids), jnp.int32), "max_new": ((b,), jnp.int32),
            "stop_seqs": ((b, max_stop_seqs, stop_seq_len), jnp.int32)}
