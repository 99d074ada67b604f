"""Random tiny transformers Qwen3 models saved as HF directories: the reference side of parity tests."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch
import transformers


def make_hf_qwen3(out_dir: Path, *, vocab=301, hidden=40, intermediate=97, layers=2, heads=4, kv_heads=2,
                  head_dim=10, tied=False, theta=12345.0, seed=0, max_shard_size=None):
    """Saves a randomly initialised ``Qwen3ForCausalLM`` (weights O(0.1), norms ≠ 1) and returns the model."""
    torch.manual_seed(seed)
    config = transformers.Qwen3Config(
        vocab_size=vocab, hidden_size=hidden, intermediate_size=intermediate, num_hidden_layers=layers,
        num_attention_heads=heads, num_key_value_heads=kv_heads, head_dim=head_dim, rope_theta=theta,
        tie_word_embeddings=tied, max_position_embeddings=1024, rms_norm_eps=1e-6)
    model = transformers.Qwen3ForCausalLM(config).eval()
    gen = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.copy_(1.0 + 0.3 * torch.randn(p.shape, generator=gen))
            else:
                p.copy_(0.15 * torch.randn(p.shape, generator=gen))
    kwargs = {} if max_shard_size is None else {"max_shard_size": max_shard_size}
    model.save_pretrained(out_dir, safe_serialization=True, **kwargs)
    return model


def hf_logits(model, tokens: np.ndarray) -> np.ndarray:
    """Returns the transformers model's fp32 logits for int tokens [B, T]."""
    with torch.no_grad():
        out = model(input_ids=torch.as_tensor(np.asarray(tokens), dtype=torch.long))
    return out.logits.float().numpy()
