"""Shared fixtures for the credit-assignment tests: a real byte-level BPE tokenizer and record builders."""

from __future__ import annotations

import pytest
from tokenizers import ByteLevelBPETokenizer


_CORPUS = [
    '<thought>I need 4 sticks, so I delegate.</thought>\n<python>r = await launch_subagent({"stick": 4}, '
    '"use planks")\nprint(r)</python>',
    '<python>craft({"oak_planks": 1}, ("stick", 4))\nprint(view_inventory())</python>',
    '<python>results = await asyncio.gather(launch_subagent({"a": 1}), launch_subagent({"b": 2}))</python>',
    'get_info(["oak_log"])\nfinish("done")\nfor t in targets:\n    x = await launch_subagent(t)\n',
    '<delegate goal="open the chest">take key, unlock chest</delegate> é ü 🌲 naïve café',
]


@pytest.fixture(scope="session")
def bpe():
    """A small byte-level BPE (the same model family as Qwen's tokenizer), trained here so no download is
    needed. Its decoded pieces are real: merges split identifiers and multi-byte characters across tokens."""
    tok = ByteLevelBPETokenizer()
    tok.train_from_iterator(_CORPUS * 20, vocab_size=420, min_frequency=2, special_tokens=["<|im_end|>"],
                            show_progress=False)
    return tok


@pytest.fixture(scope="session")
def decode(bpe):
    return lambda ids: bpe.decode(list(ids), skip_special_tokens=False)


@pytest.fixture(scope="session")
def tiny_qwen(tmp_path_factory):
    """(cfg, params, torch_model): one random tiny Qwen3 built in transformers, saved as an HF directory and loaded
    with our loader, so both frameworks hold the same fp32 weights. Norm scales are perturbed away from 1 and the
    embeddings are untied so every weight kind carries a distinct gradient."""
    import torch
    import transformers

    from sera_jax.model import load_pretrained

    torch.manual_seed(0)
    hf_cfg = transformers.Qwen3Config(vocab_size=96, hidden_size=32, intermediate_size=72, num_hidden_layers=2,
                                      num_attention_heads=4, num_key_value_heads=2, head_dim=8, rope_theta=10_000.0,
                                      rms_norm_eps=1e-6, tie_word_embeddings=False, max_position_embeddings=512)
    hf_cfg._attn_implementation = "eager"  # the plainest reference path
    model = transformers.Qwen3ForCausalLM(hf_cfg).float().eval()
    gen = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for name, p in model.named_parameters():
            scale = 0.3 if name.endswith("norm.weight") else 0.2
            base = 1.0 if name.endswith("norm.weight") else 0.0
            p.copy_(base + scale * torch.randn(p.shape, generator=gen))
    out = tmp_path_factory.mktemp("tiny_qwen")
    model.save_pretrained(out, safe_serialization=True)
    cfg, params = load_pretrained(out)
    return cfg, params, model
