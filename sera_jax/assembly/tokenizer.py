"""The tokenizer a config names (``model.tokenizer``): a Hugging Face directory or file, a sentencepiece model, or
``builtin:<name>``, a tokenizer shipped with the package (each environment's registration names its own, see
``agents.environments``; ``warmstart/tokenizer.py`` and ``warmstart/textworld_tokenizer.py`` build them)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from sera_jax.agents import environments
from sera_jax.model.tokenizer import Tokenizer, load_tokenizer

BUILTIN_PREFIX = "builtin:"
ASSETS = Path(__file__).resolve().parents[1] / "assets"
_TOKENIZERS = [t for n in environments.names() if (t := environments.environment(n).tokenizer) is not None]
BUILTIN = {t.name: ASSETS / t.asset for t in _TOKENIZERS}  # builtin name -> its file in the package
REBUILD = {t.name: t.rebuild for t in _TOKENIZERS}  # builtin name -> the module that rebuilds it
SHIPPED = BUILTIN[environments.environment(environments.DEFAULT_ENV).tokenizer.name]  # the tiny default's


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


def config_tokenizer(config: Any) -> str | None:
    """Returns ``model.tokenizer`` of a recorded run config (a dict), or None."""
    model = config.get("model") if isinstance(config, dict) else None
    spec = model.get("tokenizer") if isinstance(model, dict) else None
    return spec if isinstance(spec, str) and spec else None


def warmstart_tokenizer(directory: Path) -> str | None:
    """Returns the tokenizer a shipped warm start (``warmstart.json``) was trained with, or None."""
    record = directory / "warmstart.json"
    if not record.is_file():
        return None
    try:
        data = json.loads(record.read_text())
    except (OSError, ValueError):
        return None
    return config_tokenizer((data.get("provenance") or {}).get("config"))


def hf_dir_tokenizer(hf_dir: str | Path) -> str:
    """Returns where a Hugging Face directory's tokenizer is: the directory when it holds tokenizer files, else the
    file of the tokenizer its warm start record names (a shipped warm start carries none of its own), else the
    directory all the same (readers then fall back to their config's)."""
    hf_dir = Path(hf_dir).absolute()
    if (hf_dir / "tokenizer.json").is_file() or any(hf_dir.glob("*.model")):
        return str(hf_dir)
    spec = warmstart_tokenizer(hf_dir)
    if spec is not None:
        try:
            return resolve_tokenizer(spec, None)[1]
        except (OSError, ValueError):
            pass  # a record naming a tokenizer this install lacks: the readers' own fallbacks apply
    return str(hf_dir)
