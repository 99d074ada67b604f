"""A broken checkpoint is refused with an error that names the problem."""

import json

import numpy as np
import pytest
from safetensors.numpy import load_file, save_file

from sera_jax.model import load_pretrained
from tests.model.hf_models import make_hf_qwen3


@pytest.fixture()
def hf_dir(tmp_path):
    make_hf_qwen3(tmp_path, heads=4, kv_heads=2, tied=True)
    return tmp_path


def _rewrite(hf_dir, fn):
    path = hf_dir / "model.safetensors"
    tensors = load_file(str(path))
    fn(tensors)
    save_file(tensors, str(path), metadata={"format": "pt"})


def test_missing_tensor(hf_dir):
    _rewrite(hf_dir, lambda t: t.pop("model.layers.1.mlp.up_proj.weight"))
    with pytest.raises(ValueError, match=r"lacks tensors \['model.layers.1.mlp.up_proj.weight'\]"):
        load_pretrained(hf_dir)


def test_mismatched_tensor(hf_dir):
    def shrink(t):
        t["model.layers.0.self_attn.k_proj.weight"] = t["model.layers.0.self_attn.k_proj.weight"][:-1]
    _rewrite(hf_dir, shrink)
    with pytest.raises(ValueError, match="k_proj.weight has shape"):
        load_pretrained(hf_dir)


def test_unexpected_tensor(hf_dir):
    _rewrite(hf_dir, lambda t: t.__setitem__("model.layers.0.self_attn.q_proj.bias", np.zeros(40, np.float32)))
    with pytest.raises(ValueError, match="does not use"):
        load_pretrained(hf_dir)


def test_untied_config_without_lm_head(hf_dir):
    cfg = json.loads((hf_dir / "config.json").read_text())
    cfg["tie_word_embeddings"] = False
    (hf_dir / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ValueError, match="lm_head.weight"):
        load_pretrained(hf_dir)


def test_missing_files(tmp_path):
    with pytest.raises(FileNotFoundError, match="config.json"):
        load_pretrained(tmp_path)
    make_hf_qwen3(tmp_path)
    (tmp_path / "model.safetensors").unlink()
    with pytest.raises(FileNotFoundError, match="safetensors"):
        load_pretrained(tmp_path)
