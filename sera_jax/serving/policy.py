"""What ``sera-serve`` serves: a run directory's checkpoint or a Hugging Face directory, with the tokenizer it was
trained with, found without the user naming it."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

from sera_jax.assembly.tokenizer import config_tokenizer, resolve_tokenizer, warmstart_tokenizer
from sera_jax.model import load_pretrained
from sera_jax.model.tokenizer import Tokenizer, load_tokenizer
from sera_jax.training.checkpoint import Checkpointer, checkpoint_dir

TOKENIZER_FILES = ("tokenizer.json", "tokenizer.model")


@dataclasses.dataclass
class ServedPolicy:
    """The served model: its config, parameters, tokenizer, the name clients ask for, and where it came from."""

    model_cfg: Any
    params: Any
    tokenizer: Tokenizer
    tokenizer_path: str
    name: str
    source: str


def find_tokenizer(candidates: list[tuple[str, str | None]]) -> tuple[Tokenizer, str]:
    """Returns (tokenizer, path) of the first candidate (where it was found, spec: a path or ``builtin:<name>``)
    that loads; raises FileNotFoundError naming every place looked at when none does."""
    tried = []
    for where, spec in candidates:
        if not spec:
            continue
        try:
            if spec.startswith("builtin:"):
                tok, path = resolve_tokenizer(spec, None)
                return tok, path
            return load_tokenizer(spec), spec
        except (OSError, ValueError) as e:
            tried.append(f"{where} {spec}: {e}")
    raise FileNotFoundError("no tokenizer found for the served model; looked at: " + ("; ".join(tried) or "nothing")
                            + ". Pass --tokenizer PATH (a tokenizer.json, a sentencepiece .model, or builtin:NAME)")


def _hf_candidates(hf_dir: Path) -> list[tuple[str, str | None]]:
    has_file = any((hf_dir / n).is_file() for n in TOKENIZER_FILES) or any(hf_dir.glob("*.model"))
    return [("the HF directory", str(hf_dir) if has_file else None),
            ("the warm start record of", warmstart_tokenizer(hf_dir))]


def load_served_policy(run_dir: str | Path | None = None, *, hf_dir: str | Path | None = None,
                       version: int | None = None, tokenizer: str | None = None, name: str | None = None,
                       dtype: str = "float32") -> ServedPolicy:
    """Returns the ServedPolicy of a run directory (its checkpoint ``version``, default the latest) or of a HF
    directory. The tokenizer is ``tokenizer`` when given, else the one the checkpoint records, the run config's
    ``model.tokenizer`` (a ``builtin:`` one included), or that of the warm start the run was imported from.
    Raises ValueError when neither or both sources are given, FileNotFoundError when a path or tokenizer is missing."""
    if (run_dir is None) == (hf_dir is None):
        raise ValueError("serve a run directory or a HF directory (--hf), exactly one")
    explicit = [("--tokenizer", tokenizer)]
    if hf_dir is not None:
        hf = Path(hf_dir)
        if not (hf / "config.json").is_file():
            raise FileNotFoundError(f"{hf} is not a Hugging Face model directory (no config.json)")
        model_cfg, params = load_pretrained(hf, param_dtype=dtype, dtype=dtype)
        tok, tok_path = find_tokenizer(explicit + _hf_candidates(hf))
        return ServedPolicy(model_cfg, params, tok, str(tok_path), name or hf.resolve().name, f"hf {hf}")
    ck_dir = checkpoint_dir(run_dir)
    ck = Checkpointer(ck_dir)
    try:
        model_cfg, params, meta = ck.restore_model(version)
    finally:
        ck.close()
    recorded = meta.get("tokenizer_path")
    candidates = explicit + [("the checkpoint's tokenizer_path", recorded),
                             ("the run config's model.tokenizer", config_tokenizer((meta.get("run") or {}).get("config")))]
    if recorded and Path(recorded).is_dir():  # imported with `sera-export --import` from a HF dir or a warm start
        candidates += _hf_candidates(Path(recorded))
    tok, tok_path = find_tokenizer(candidates)
    run = Path(run_dir).resolve()
    default_name = run.parent.name if run.name == "checkpoints" else run.name
    return ServedPolicy(model_cfg, params, tok, str(tok_path), name or default_name,
                        f"checkpoint {ck_dir} version {meta.get('version')}")
