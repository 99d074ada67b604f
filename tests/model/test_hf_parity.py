"""Logit parity with transformers' Qwen3ForCausalLM, and HF save/load round trips."""

import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
import transformers

from sera_jax.model import forward, load_pretrained, save_pretrained
from tests.model.hf_models import hf_logits, make_hf_qwen3

CONFIGS = {
    "gqa1_untied": dict(heads=4, kv_heads=4, tied=False),
    "gqa2_tied": dict(heads=4, kv_heads=2, tied=True),
    "gqa4_untied_odd": dict(vocab=257, hidden=36, intermediate=71, heads=8, kv_heads=2, head_dim=6, tied=False,
                            layers=3),
    "gqa4_tied_odd": dict(vocab=263, hidden=52, intermediate=33, heads=4, kv_heads=1, head_dim=14, tied=True),
}


def _tokens(vocab, b=2, t=13, seed=0):
    return np.random.default_rng(seed).integers(0, vocab, size=(b, t)).astype(np.int32)


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_fp32_logits_match_transformers(tmp_path, name):
    spec = CONFIGS[name]
    model = make_hf_qwen3(tmp_path, **spec)
    cfg, params = load_pretrained(tmp_path)
    assert cfg.tie_word_embeddings == spec["tied"]
    assert ("lm_head" in params) != spec["tied"]
    tokens = _tokens(cfg.vocab_size)
    ours = np.asarray(forward(params, cfg, jnp.asarray(tokens)))
    ref = hf_logits(model, tokens)
    assert np.abs(ref).max() > 1.0  # the comparison is not between two near-zero tensors
    np.testing.assert_array_less(np.abs(ours - ref).max(), 1e-4)


def test_bf16_logits_within_bound(tmp_path):
    """bf16 compute (fp32 master weights) vs the fp32 reference: bounded by bf16 rounding through 2 layers."""
    model = make_hf_qwen3(tmp_path, **CONFIGS["gqa2_tied"])
    cfg, params = load_pretrained(tmp_path, dtype="bfloat16")
    tokens = _tokens(cfg.vocab_size)
    ours = np.asarray(forward(params, cfg, jnp.asarray(tokens)))
    ref = hf_logits(model, tokens)
    err = np.abs(ours - ref)
    scale = np.abs(ref).max()
    # Stated bound: max error ≤ 3% of the logit range, mean error ≤ 0.5% of it (bf16 has an 8-bit mantissa).
    assert err.max() <= 0.03 * scale, (err.max(), scale)
    assert err.mean() <= 0.005 * scale, (err.mean(), scale)
    # and bf16 is really in use: the result differs from the fp32 one
    cfg32, params32 = load_pretrained(tmp_path)
    assert np.abs(np.asarray(forward(params32, cfg32, jnp.asarray(tokens))) - ours).max() > 1e-4


def test_positions_and_rope_theta_matter(tmp_path):
    model = make_hf_qwen3(tmp_path, **CONFIGS["gqa2_tied"])
    cfg, params = load_pretrained(tmp_path)
    tokens = _tokens(cfg.vocab_size, b=1, t=9)
    pos = jnp.arange(9)[None] + 100
    ours = np.asarray(forward(params, cfg, jnp.asarray(tokens), pos))
    with torch.no_grad():
        ref = model(input_ids=torch.as_tensor(tokens, dtype=torch.long),
                    position_ids=torch.arange(9)[None] + 100).logits.numpy()
    np.testing.assert_array_less(np.abs(ours - ref).max(), 1e-4)
    other = forward(params, cfg.replace(rope_theta=10.0), jnp.asarray(tokens), pos)
    assert np.abs(np.asarray(other) - ref).max() > 1e-3


@pytest.mark.parametrize("name", ["gqa1_untied", "gqa2_tied"])
def test_save_pretrained_loads_in_transformers(tmp_path, name):
    make_hf_qwen3(tmp_path / "src", **CONFIGS[name])
    cfg, params = load_pretrained(tmp_path / "src")
    save_pretrained(cfg, params, tmp_path / "out")
    reloaded = transformers.Qwen3ForCausalLM.from_pretrained(tmp_path / "out", dtype=torch.float32).eval()
    tokens = _tokens(cfg.vocab_size, seed=3)
    ours = np.asarray(forward(params, cfg, jnp.asarray(tokens)))
    np.testing.assert_array_less(np.abs(hf_logits(reloaded, tokens) - ours).max(), 1e-4)
    # Round trip through our own loader is bit-exact.
    cfg2, params2 = load_pretrained(tmp_path / "out")
    assert cfg2 == cfg
    for a, b in zip(jax.tree.leaves(params), jax.tree.leaves(params2)):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    assert jax.tree.structure(params) == jax.tree.structure(params2)


def test_sharded_checkpoint_with_index(tmp_path):
    model = make_hf_qwen3(tmp_path / "src", **CONFIGS["gqa4_untied_odd"], max_shard_size="20KB")
    assert (tmp_path / "src" / "model.safetensors.index.json").is_file()
    cfg, params = load_pretrained(tmp_path / "src")
    tokens = _tokens(cfg.vocab_size, seed=5)
    np.testing.assert_array_less(
        np.abs(np.asarray(forward(params, cfg, jnp.asarray(tokens))) - hf_logits(model, tokens)).max(), 1e-4)
    files = save_pretrained(cfg, params, tmp_path / "out", max_shard_bytes=30_000)
    assert len(files) > 1 and (tmp_path / "out" / "model.safetensors.index.json").is_file()
    reloaded = transformers.Qwen3ForCausalLM.from_pretrained(tmp_path / "out", dtype=torch.float32).eval()
    np.testing.assert_array_less(np.abs(hf_logits(reloaded, tokens) - hf_logits(model, tokens)).max(), 1e-5)


def test_bf16_save_is_bf16_on_disk(tmp_path):
    make_hf_qwen3(tmp_path / "src", **CONFIGS["gqa2_tied"])
    cfg, params = load_pretrained(tmp_path / "src")
    save_pretrained(cfg, params, tmp_path / "out", dtype="bfloat16")
    header_len = int.from_bytes((tmp_path / "out" / "model.safetensors").read_bytes()[:8], "little")
    header = json.loads((tmp_path / "out" / "model.safetensors").read_bytes()[8:8 + header_len])
    assert {v["dtype"] for k, v in header.items() if k != "__metadata__"} == {"BF16"}


def test_both_rope_theta_layouts(tmp_path):
    make_hf_qwen3(tmp_path, **CONFIGS["gqa2_tied"])
    raw = json.loads((tmp_path / "config.json").read_text())
    assert "rope_parameters" in raw  # transformers ≥ 5 writes the nested layout
    cfg_nested, _ = load_pretrained(tmp_path)
    raw["rope_theta"] = raw.pop("rope_parameters")["rope_theta"]
    (tmp_path / "config.json").write_text(json.dumps(raw))
    cfg_top, _ = load_pretrained(tmp_path)
    assert cfg_nested == cfg_top and cfg_top.rope_theta == 12345.0
