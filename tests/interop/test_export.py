"""Run checkpoint → HF directory → transformers gives our logits; HF → run checkpoint → same parameters."""

import jax
import jax.numpy as jnp
import numpy as np
import torch
import transformers

from sera_jax.interop.export import export_checkpoint, import_pretrained
from sera_jax.model import Qwen3Config, abstract_params, forward, init_params
from sera_jax.rl.optim import OptimConfig, make_optimizer
from sera_jax.training.checkpoint import Checkpointer, model_config_record
from sera_jax.training.step import init_train_state
from tests.model.hf_models import hf_logits, make_hf_qwen3


def test_export_then_transformers_logits(tmp_path):
    cfg = Qwen3Config.preset("tiny", tie_word_embeddings=False)
    params = init_params(jax.random.key(4), cfg)
    state = init_train_state(params, make_optimizer(OptimConfig()))
    ck = Checkpointer(tmp_path / "run", every=1)
    (tmp_path / "tok").mkdir()
    (tmp_path / "tok" / "tokenizer.json").write_text("{}")
    ck.save(3, state, {"model_config": model_config_record(cfg), "tokenizer_path": str(tmp_path / "tok")})
    ck.close()
    info = export_checkpoint(tmp_path / "run", tmp_path / "hf", dtype="float32")
    assert info["version"] == 3 and info["tokenizer_files"] == ["tokenizer.json"]
    model = transformers.Qwen3ForCausalLM.from_pretrained(tmp_path / "hf", dtype=torch.float32).eval()
    tokens = np.random.default_rng(0).integers(0, cfg.vocab_size, (2, 10)).astype(np.int32)
    ours = np.asarray(forward(params, cfg, jnp.asarray(tokens)))
    np.testing.assert_array_less(np.abs(hf_logits(model, tokens) - ours).max(), 1e-4)


def test_import_pretrained_round_trip(tmp_path):
    make_hf_qwen3(tmp_path / "hf", tied=True)
    import_pretrained(tmp_path / "hf", tmp_path / "run")
    ck = Checkpointer(tmp_path / "run" / "checkpoints")
    meta = ck.read_meta()
    cfg = Qwen3Config(**meta["model_config"])
    params, _ = ck.restore_params(abstract_params(cfg))
    ck.close()
    export_checkpoint(tmp_path / "run", tmp_path / "back", dtype="float32")
    from safetensors.numpy import load_file
    a = load_file(str(tmp_path / "hf" / "model.safetensors"))
    b = load_file(str(tmp_path / "back" / "model.safetensors"))
    for name in b:
        np.testing.assert_array_equal(a[name], b[name])
    assert params["embed"]["embedding"].dtype == jnp.float32


def test_cli_round_trip(tmp_path):
    """``sera-export --import`` then ``sera-export``: the command line gives back the same tensors."""
    import subprocess
    import sys

    make_hf_qwen3(tmp_path / "hf", tied=False)
    run = [sys.executable, "-m", "sera_jax.cli.export"]
    subprocess.run(run + [str(tmp_path / "hf"), str(tmp_path / "run"), "--import"], check=True, timeout=300)
    out = subprocess.run(run + [str(tmp_path / "run"), str(tmp_path / "back"), "--dtype", "float32"], check=True,
                         timeout=300, capture_output=True, text=True).stdout
    assert '"version": 0' in out
    from safetensors.numpy import load_file
    a = load_file(str(tmp_path / "hf" / "model.safetensors"))
    b = load_file(str(tmp_path / "back" / "model.safetensors"))
    assert sorted(a) == sorted(b)
    for name in a:
        np.testing.assert_array_equal(a[name], b[name])


def test_export_takes_the_run_directory_or_its_checkpoints(tmp_path):
    """``sera-export runs/x out/`` (the run directory, as README writes it) and ``runs/x/checkpoints`` both work; a
    directory that is neither is refused by name."""
    import pytest

    cfg = Qwen3Config.preset("tiny")
    state = init_train_state(init_params(jax.random.key(1), cfg), make_optimizer(OptimConfig()))
    ck = Checkpointer(tmp_path / "run" / "checkpoints", every=1)
    ck.save(2, state, {"model_config": model_config_record(cfg)})
    ck.close()
    a = export_checkpoint(tmp_path / "run", tmp_path / "a", dtype="float32")
    b = export_checkpoint(tmp_path / "run" / "checkpoints", tmp_path / "b", dtype="float32")
    assert a["version"] == b["version"] == 2
    assert (tmp_path / "a" / "model.safetensors").read_bytes() == (tmp_path / "b" / "model.safetensors").read_bytes()
    with pytest.raises(FileNotFoundError, match="no run or checkpoint directory"):
        export_checkpoint(tmp_path / "missing", tmp_path / "c")
