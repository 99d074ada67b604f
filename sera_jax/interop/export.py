"""Training checkpoints ⇄ Hugging Face directories.

``export_checkpoint``: an orbax run checkpoint (its ``params`` item and the model config stored in its metadata)
→ ``config.json`` + safetensors (+ the run's tokenizer files), a directory transformers' ``Qwen3ForCausalLM``
loads with the same logits. ``import_pretrained``: the reverse — a HF directory → a version-0 run directory
(parameters in fp32 master precision, a fresh optimizer state) to start training from.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

from sera_jax.assembly.tokenizer import hf_dir_tokenizer
from sera_jax.model import load_pretrained, save_pretrained
from sera_jax.rl.optim import OptimConfig, make_optimizer
from sera_jax.training.checkpoint import Checkpointer, checkpoint_dir, model_config_record, run_metadata
from sera_jax.training.step import init_train_state

TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "generation_config.json", "special_tokens_map.json",
                   "vocab.json", "merges.txt", "tokenizer.model")


def copy_tokenizer(src: str | Path | None, dst: str | Path) -> list[str]:
    """Copies the tokenizer files found in ``src`` into ``dst``; returns their names."""
    if src is None:
        return []
    src, dst = Path(src), Path(dst)
    if src.is_file():
        shutil.copy2(src, dst / src.name)
        return [src.name]
    copied = []
    for name in TOKENIZER_FILES:
        if (src / name).is_file():
            shutil.copy2(src / name, dst / name)
            copied.append(name)
    return copied


def export_checkpoint(ckpt_dir: str | Path, out_dir: str | Path, *, version: int | None = None,
                      dtype: str = "bfloat16", tokenizer: str | Path | None = None) -> dict[str, Any]:
    """Writes a HF directory from a run checkpoint (``ckpt_dir``: the run directory or its ``checkpoints/``);
    returns {version, out_dir, files, tokenizer_files}.

    The tokenizer comes from ``tokenizer`` or else from the path recorded in the checkpoint metadata.
    """
    ck = Checkpointer(checkpoint_dir(ckpt_dir))
    try:
        cfg, params, meta = ck.restore_model(version)
        version = meta["version"]
    finally:
        ck.close()
    out_dir = Path(out_dir)
    files = save_pretrained(cfg, params, out_dir, dtype=dtype)
    tok = copy_tokenizer(tokenizer or meta.get("tokenizer_path"), out_dir)
    return {"version": version, "out_dir": str(out_dir), "files": [str(f) for f in files], "tokenizer_files": tok}


def import_pretrained(hf_dir: str | Path, run_dir: str | Path, *, optim: OptimConfig = OptimConfig(),
                      **overrides: Any) -> Path:
    """Writes a version-0 run (fp32 params, fresh AdamW state) from a HF directory: its checkpoint under
    ``run_dir/checkpoints``, the layout a training run writes, so ``model.init_from``, ``sera-eval --checkpoint``
    and ``sera-serve`` take ``run_dir`` as it is (a ``run_dir`` named ``checkpoints`` is taken to be that folder of
    a run, and written into). Returns the run directory."""
    run_dir = Path(run_dir)
    if run_dir.name == "checkpoints":
        run_dir = run_dir.parent
    cfg, params = load_pretrained(hf_dir, **overrides)
    state = init_train_state(params, make_optimizer(optim))
    ck = Checkpointer(run_dir / "checkpoints", every=1)
    try:
        meta = {"model_config": model_config_record(cfg), "tokenizer_path": hf_dir_tokenizer(hf_dir),
                "run": run_metadata({"imported_from": str(hf_dir)}), "stage_clock": 0}
        ck.save(0, state, meta, force=True)
    finally:
        ck.close()
    return run_dir
