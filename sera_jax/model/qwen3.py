"""Qwen3 decoder in Flax (linen): RMSNorm, rotary embeddings, GQA with per-head q/k norms, SwiGLU, scanned layers.

The public surface is functional: ``init_params(key, cfg) -> params`` and
``forward(params, cfg, tokens_BT, positions_BT=None, segment_ids_BT=None) -> logits_BTV`` are pure.

Parameters carry logical axis names (``param_logical_axes``); ``sera_jax.parallel.rules`` maps them to mesh axes, so
no module here names a mesh axis. Layers are stacked on a leading ``layers`` axis and run under ``nn.scan``, so compile
time does not grow with depth. Weights are stored in ``cfg.param_dtype`` and cast to ``cfg.dtype`` at use.

Attention is pluggable: a layer computes q, k, v and hands them to ``attention_fn(q, k, v, layer_cache, aux)``,
which returns the attended values and the layer's new cache. Training uses ``dense_attention`` (causal, segment-
masked, through ``jax.nn.dot_product_attention``); the rollout engine passes its paged-cache attention.

Parameter tree (L = layers, D = hidden, H/K = query/kv heads, E = head_dim, F = intermediate, V = vocab)::

    embed/embedding [V, D]                     final_norm/scale [D]          lm_head/kernel [D, V] (untied only)
    layers/attn_norm/scale [L, D]              layers/mlp_norm/scale [L, D]
    layers/attn/q_proj [L, D, H, E]  k_proj, v_proj [L, D, K, E]  o_proj [L, H, E, D]  q_norm, k_norm [L, E]
    layers/mlp/gate_proj, up_proj [L, D, F]    down_proj [L, F, D]
"""

from __future__ import annotations

import functools
from typing import Any, Callable

import flax.linen as nn
import jax
import jax.numpy as jnp
from jaxtyping import Array, Float, Int

from sera_jax.model.config import Qwen3Config

Params = dict[str, Any]
AttentionFn = Callable[..., tuple[jax.Array, Any]]


# ---------------------------------------------------------------------------------------------------------------
# Pure building blocks
# ---------------------------------------------------------------------------------------------------------------
def rms_norm(x: jax.Array, scale: jax.Array, eps: float) -> jax.Array:
    """Returns x normalised by its root mean square over the last axis (in fp32), times ``scale``, in x's dtype."""
    x32 = x.astype(jnp.float32)
    normed = x32 * jax.lax.rsqrt(jnp.mean(jnp.square(x32), axis=-1, keepdims=True) + eps)
    return normed.astype(x.dtype) * scale.astype(x.dtype)


def rope_tables(positions_BT: Int[Array, "B T"], head_dim: int, theta: float):
    """Returns (cos, sin) of shape [B, T, head_dim] for rotary embeddings at ``positions`` (fp32)."""
    inv_freq = 1.0 / (theta ** (jnp.arange(0, head_dim, 2, dtype=jnp.float32) / head_dim))
    angles = positions_BT.astype(jnp.float32)[..., None] * inv_freq  # [B, T, E/2]
    angles = jnp.concatenate([angles, angles], axis=-1)
    return jnp.cos(angles), jnp.sin(angles)


def apply_rope(x_BTNE: jax.Array, cos_BTE: jax.Array, sin_BTE: jax.Array) -> jax.Array:
    """Returns x rotated by the (half-split) rotary embedding, computed in fp32, in x's dtype."""
    x32 = x_BTNE.astype(jnp.float32)
    half = x32.shape[-1] // 2
    rotated = jnp.concatenate([-x32[..., half:], x32[..., :half]], axis=-1)
    out = x32 * cos_BTE[:, :, None, :] + rotated * sin_BTE[:, :, None, :]
    return out.astype(x_BTNE.dtype)


def dense_attention(q_BTHE, k_BSKE, v_BSKE, layer_cache, aux, *, implementation: str | None = None):
    """Causal attention within packed segments; returns (out_BTHE, layer_cache unchanged).

    ``aux["segment_ids"]`` [B, T] marks packed sequences (tokens attend only within their own segment id; 0 is
    padding, which attends only to padding and is masked out of every loss). Implemented with
    ``jax.nn.dot_product_attention`` (grouped heads natively; softmax in fp32), so cuDNN is used where XLA can.
    """
    seg = aux["segment_ids"]
    t = q_BTHE.shape[1]
    causal = jnp.tril(jnp.ones((t, t), dtype=bool))
    mask = (seg[:, :, None] == seg[:, None, :]) & causal[None]
    out = jax.nn.dot_product_attention(
        q_BTHE, k_BSKE, v_BSKE, mask=mask[:, None, :, :], scale=q_BTHE.shape[-1] ** -0.5,
        implementation=implementation)
    return out, layer_cache


def _project(x_ND: jax.Array, w_DHE: jax.Array) -> jax.Array:
    """Returns x [N, D] @ w [D, H, E] as [N, H·E]: a plain 2-D matmul."""
    return x_ND @ w_DHE.reshape(w_DHE.shape[0], -1)


def _init(std: float):
    return nn.initializers.normal(stddev=std)


# ---------------------------------------------------------------------------------------------------------------
# Modules
# ---------------------------------------------------------------------------------------------------------------
class RMSNorm(nn.Module):
    cfg: Qwen3Config
    axis_name: str = "norm"

    @nn.compact
    def __call__(self, x):
        scale = self.param("scale", nn.with_logical_partitioning(nn.initializers.ones, (self.axis_name,)),
                           (x.shape[-1],), self.cfg.weight_dtype)
        return rms_norm(x, scale, self.cfg.rms_norm_eps)


class Attention(nn.Module):
    cfg: Qwen3Config
    attention_fn: AttentionFn = dense_attention

    @nn.compact
    def __call__(self, x_BTD, cos_BTE, sin_BTE, layer_cache, aux):
        cfg = self.cfg
        d, h, k, e = cfg.hidden_size, cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
        dt, wt = cfg.compute_dtype, cfg.weight_dtype
        std = d ** -0.5
        wq = self.param("q_proj", nn.with_logical_partitioning(_init(std), ("embed", "heads", "head_dim")),
                        (d, h, e), wt)
        wk = self.param("k_proj", nn.with_logical_partitioning(_init(std), ("embed", "kv_heads", "head_dim")),
                        (d, k, e), wt)
        wv = self.param("v_proj", nn.with_logical_partitioning(_init(std), ("embed", "kv_heads", "head_dim")),
                        (d, k, e), wt)
        wo = self.param("o_proj", nn.with_logical_partitioning(_init((h * e) ** -0.5),
                                                               ("heads", "head_dim", "embed")), (h, e, d), wt)
        b, t = x_BTD.shape[:2]
        x_ND = x_BTD.astype(dt).reshape(b * t, d)
        q = _project(x_ND, wq.astype(dt)).reshape(b, t, h, e)
        kk = _project(x_ND, wk.astype(dt)).reshape(b, t, k, e)
        v = _project(x_ND, wv.astype(dt)).reshape(b, t, k, e)
        # Qwen3: RMSNorm over head_dim on q and k, before the rotary embedding.
        q = RMSNorm(cfg, axis_name="head_dim", name="q_norm")(q)
        kk = RMSNorm(cfg, axis_name="head_dim", name="k_norm")(kk)
        q = apply_rope(q, cos_BTE, sin_BTE)
        kk = apply_rope(kk, cos_BTE, sin_BTE)
        q = nn.with_logical_constraint(q, ("batch", "length", "act_heads", "head_dim"))
        kk = nn.with_logical_constraint(kk, ("batch", "length", "act_kv_heads", "head_dim"))
        out, layer_cache = self.attention_fn(q, kk, v, layer_cache, aux)
        y_ND = out.astype(dt).reshape(b * t, h * e) @ wo.astype(dt).reshape(h * e, d)
        return y_ND.reshape(b, t, d), layer_cache


class MLP(nn.Module):
    cfg: Qwen3Config

    @nn.compact
    def __call__(self, x_BTD):
        cfg = self.cfg
        d, f, dt, wt = cfg.hidden_size, cfg.intermediate_size, cfg.compute_dtype, cfg.weight_dtype
        wg = self.param("gate_proj", nn.with_logical_partitioning(_init(d ** -0.5), ("embed", "mlp")), (d, f), wt)
        wu = self.param("up_proj", nn.with_logical_partitioning(_init(d ** -0.5), ("embed", "mlp")), (d, f), wt)
        wd = self.param("down_proj", nn.with_logical_partitioning(_init(f ** -0.5), ("mlp", "embed")), (f, d), wt)
        b, t = x_BTD.shape[:2]
        x_ND = x_BTD.astype(dt).reshape(b * t, d)
        hidden_NF = jax.nn.silu(x_ND @ wg.astype(dt)) * (x_ND @ wu.astype(dt))
        hidden = nn.with_logical_constraint(hidden_NF.reshape(b, t, f), ("batch", "length", "act_mlp"))
        return (hidden.reshape(b * t, f) @ wd.astype(dt)).reshape(b, t, d)


class DecoderLayer(nn.Module):
    cfg: Qwen3Config
    attention_fn: AttentionFn = dense_attention

    @nn.compact
    def __call__(self, x_BTD, layer_cache, cos_BTE, sin_BTE, aux):
        cfg = self.cfg
        attn_out, layer_cache = Attention(cfg, self.attention_fn, name="attn")(
            RMSNorm(cfg, name="attn_norm")(x_BTD), cos_BTE, sin_BTE, layer_cache, aux)
        x = x_BTD + attn_out
        x = x + MLP(cfg, name="mlp")(RMSNorm(cfg, name="mlp_norm")(x))
        x = nn.with_logical_constraint(x, ("batch", "length", "act_embed"))
        return x, layer_cache


class Qwen3(nn.Module):
    """The decoder trunk plus (un)embedding. ``__call__`` returns (final hidden states [B,T,D], new caches)."""

    cfg: Qwen3Config
    attention_fn: AttentionFn = dense_attention

    def setup(self):
        cfg = self.cfg
        self.embed = nn.Embed(
            cfg.vocab_size, cfg.hidden_size, dtype=cfg.compute_dtype, param_dtype=cfg.weight_dtype,
            # Tied: the table is also the output head, so unit-variance rows would give logits of std √hidden
            # (a random tiny model starting at NLL ≈ 80); untied keeps the usual unit-variance embedding.
            embedding_init=nn.with_logical_partitioning(
                _init(cfg.hidden_size ** -0.5 if cfg.tie_word_embeddings else 1.0), ("vocab", "embed")),
            name="embed")
        layer = DecoderLayer
        if cfg.remat:
            layer = nn.remat(layer, prevent_cse=False)
        self.layers = nn.scan(
            layer, variable_axes={"params": 0}, split_rngs={"params": True},
            in_axes=(0, nn.broadcast, nn.broadcast, nn.broadcast), length=cfg.num_layers,
            metadata_params={nn.PARTITION_NAME: "layers"})(cfg, self.attention_fn, name="layers")
        self.final_norm = RMSNorm(cfg, name="final_norm")
        if not cfg.tie_word_embeddings:
            self.lm_head = self.param(
                "lm_head", nn.with_logical_partitioning(_init(cfg.hidden_size ** -0.5), ("embed", "vocab")),
                (cfg.hidden_size, cfg.vocab_size), cfg.weight_dtype)

    def __call__(self, tokens_BT, positions_BT, caches=None, aux=None):
        cfg = self.cfg
        x = self.embed(tokens_BT).astype(cfg.compute_dtype)
        x = nn.with_logical_constraint(x, ("batch", "length", "act_embed"))
        cos, sin = rope_tables(positions_BT, cfg.head_dim, cfg.rope_theta)
        x, caches = self.layers(x, caches, cos, sin, aux or {})
        return self.final_norm(x), caches

    def unembed_matrix(self):
        """Returns the [D, V] output projection in the compute dtype (the embedding's transpose when tied)."""
        if self.cfg.tie_word_embeddings:
            return self.embed.embedding.T.astype(self.cfg.compute_dtype)
        return self.lm_head.astype(self.cfg.compute_dtype)

    def trunk_and_unembed(self, tokens_BT, positions_BT, caches=None, aux=None):
        hidden, caches = self(tokens_BT, positions_BT, caches, aux)
        return hidden, self.unembed_matrix(), caches


# ---------------------------------------------------------------------------------------------------------------
# Functional API
# ---------------------------------------------------------------------------------------------------------------
def _check_tokens(tokens_BT) -> None:
    if tokens_BT.ndim != 2:
        raise ValueError(f"tokens must be [batch, length], got shape {tokens_BT.shape}")
    if not jnp.issubdtype(tokens_BT.dtype, jnp.integer):
        raise ValueError(f"tokens must be integers, got {tokens_BT.dtype}")


def default_positions(tokens_BT, segment_ids_BT=None):
    """Returns positions 0.. per row, restarting at every new segment id when ``segment_ids`` is given."""
    b, t = tokens_BT.shape
    idx = jnp.broadcast_to(jnp.arange(t, dtype=jnp.int32), (b, t))
    if segment_ids_BT is None:
        return idx
    starts = jnp.concatenate([jnp.ones((b, 1), bool), segment_ids_BT[:, 1:] != segment_ids_BT[:, :-1]], axis=1)
    start_idx = jax.lax.cummax(jnp.where(starts, idx, 0), axis=1)
    return idx - start_idx


def init_params(key: jax.Array, cfg: Qwen3Config) -> Params:
    """Returns freshly initialised parameters (plain arrays in ``cfg.param_dtype``; no metadata boxes)."""
    return _unbox(_init_boxed(key, cfg))


def _unbox(tree):
    # Plain values without applying sharding constraints: placement is the caller's job (parallel.rules).
    return jax.tree.map(lambda b: b.value if isinstance(b, nn.meta.AxisMetadata) else b, tree,
                        is_leaf=lambda b: isinstance(b, nn.meta.AxisMetadata))


def _init_boxed(key, cfg: Qwen3Config):
    tokens = jnp.zeros((1, 1), jnp.int32)
    # Initialise outside any ambient logical rules: activation constraints of a 1-token dummy batch are meaningless.
    with nn.logical_axis_rules(()):
        variables = Qwen3(cfg).init(key, tokens, jnp.zeros((1, 1), jnp.int32),
                                    aux={"segment_ids": jnp.ones((1, 1), jnp.int32)})
    return variables["params"]


def abstract_params(cfg: Qwen3Config) -> Params:
    """Returns the parameter tree as ``jax.ShapeDtypeStruct`` leaves, without allocating anything."""
    return _unbox(jax.eval_shape(lambda k: _init_boxed(k, cfg), jax.random.key(0)))


def param_logical_axes(cfg: Qwen3Config):
    """Returns a tree shaped like the parameters whose leaves are ``PartitionSpec``s of logical axis names."""
    boxed = jax.eval_shape(lambda k: _init_boxed(k, cfg), jax.random.key(0))
    return nn.get_partition_spec(boxed)


def hidden_states(params: Params, cfg: Qwen3Config, tokens_BT, positions_BT=None, segment_ids_BT=None,
                  attention_impl: str | None = None):
    """Returns (final-norm hidden states [B, T, D] in the compute dtype, unembedding matrix [D, V])."""
    _check_tokens(tokens_BT)
    if segment_ids_BT is None:
        segment_ids_BT = jnp.ones(tokens_BT.shape, jnp.int32)
    if positions_BT is None:
        positions_BT = default_positions(tokens_BT, segment_ids_BT)
    aux = {"segment_ids": segment_ids_BT}
    if attention_impl in (None, "pallas", "reference", "cudnn"):
        # GPU: the Pallas flash kernel (segment ids, causal, GQA, fused backward); elsewhere dense_attention.
        from sera_jax.kernels.select import select_training_attention  # lazy: the kernels import Pallas

        attention_fn = select_training_attention(dense_attention, attention_impl)
    else:  # "xla": jax.nn.dot_product_attention's own choice
        attention_fn = functools.partial(dense_attention, implementation=attention_impl)
    hidden, unembed, _ = Qwen3(cfg, attention_fn).apply({"params": params}, tokens_BT, positions_BT, None, aux,
                                          method=Qwen3.trunk_and_unembed)
    return hidden, unembed


def forward(params: Params, cfg: Qwen3Config, tokens_BT: Int[Array, "B T"],
            positions_BT: Int[Array, "B T"] | None = None,
            segment_ids_BT: Int[Array, "B T"] | None = None) -> Float[Array, "B T V"]:
    """Returns logits [B, T, V] (fp32) for every position. Pure.

    Materialises the full logits: use ``token_logprobs`` for training-length sequences.
    ``segment_ids`` (optional) packs several sequences per row; positions then restart at each segment.
    """
    hidden, unembed = hidden_states(params, cfg, tokens_BT, positions_BT, segment_ids_BT)
    return jnp.einsum("btd,dv->btv", hidden, unembed, preferred_element_type=jnp.float32)
