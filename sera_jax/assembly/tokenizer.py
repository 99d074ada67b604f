"""The tokenizer a config names (``model.tokenizer``): a Hugging Face directory or file, a sentencepiece model, or
``builtin:<name>``, a tokenizer shipped with the package (``warmstart/tokenizer.py`` builds them)."""

from __future__ import annotations

from pathlib import Path

from sera_jax.model.tokenizer import Tokenizer, load_tokenizer

BUILTIN_PREFIX = "builtin:"
ASSETS = Path(__file__).resolve().parents[1] / "assets"
SHIPPED = ASSETS / "textcraft_tiny.model"
BUILTIN = {"textcraft": SHIPPED, "textworld": ASSETS / "textworld_tiny.model"}
REBUILD = {"textcraft": "sera_jax.warmstart.tokenizer", "textworld": "sera_jax.warmstart.textworld_tokenizer"}


def resolve_tokenizer(spec: str | None, hf_dir: str | None) -> tuple[Tokenizer, str]:
    """Returns (tokenizer, path) for a config's ``model.tokenizer`` (see ``config.ModelSection``); with none given,
    the tokenizer of ``model.hf_dir``. Raises ValueError for an unknown builtin name or no tokenizer at all, and
    FileNotFoundError when a builtin's file is missing from the installed package."""
    if spec is None:
        if hf_dir is None:
            raise ValueError("model.tokenizer: no tokenizer given and no model.hf_dir to take it from")
        spec = hf_dir
    if spec.startswith(BUILTIN_PREFIX):
        name = spec[len(BUILTIN_PREFIX):]
        if name not in BUILTIN:
            known = ", ".join(BUILTIN_PREFIX + k for k in sorted(BUILTIN))
            raise ValueError(f"model.tokenizer: unknown builtin tokenizer {name!r} (known: {known})")
        path = BUILTIN[name]
        if not path.is_file():
            raise FileNotFoundError(f"model.tokenizer: {spec}'s file {path} is missing from the package; rebuild it "
                                    f"with `python -m {REBUILD[name]} {path}`")
        spec = str(path)
    return load_tokenizer(spec), spec
