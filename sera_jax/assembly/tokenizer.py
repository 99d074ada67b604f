"""The tokenizer a config names (``model.tokenizer``): a Hugging Face directory or file, a sentencepiece model, or
``builtin:<name>``, a tokenizer shipped with the package (each environment's registration names its own, see
``agents.environments``; ``warmstart/tokenizer.py`` and ``warmstart/textworld_tokenizer.py`` build them)."""

from __future__ import annotations

from pathlib import Path

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
