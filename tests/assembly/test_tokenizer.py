"""assembly.tokenizer: a config's ``model.tokenizer`` resolved to a tokenizer, with clear errors."""

from __future__ import annotations

import pytest

from sera_jax.assembly import tokenizer as T


def test_builtin_textcraft_is_the_shipped_file():
    tok, path = T.resolve_tokenizer("builtin:textcraft", None)
    assert path == str(T.SHIPPED) and tok.vocab_size == 1024
    assert tok.decode(tok.encode("craft 1 stick")) == "craft 1 stick"


def test_a_path_is_loaded_and_none_falls_back_to_hf_dir():
    tok, path = T.resolve_tokenizer(None, str(T.SHIPPED))
    assert path == str(T.SHIPPED) and tok.vocab_size == 1024
    with pytest.raises(ValueError, match="no tokenizer given and no model.hf_dir"):
        T.resolve_tokenizer(None, None)


def test_unknown_builtin_names_the_known_ones():
    with pytest.raises(ValueError, match=r"unknown builtin tokenizer 'nope' \(known: builtin:textcraft"):
        T.resolve_tokenizer("builtin:nope", None)


def test_missing_shipped_file_says_how_to_rebuild(monkeypatch, tmp_path):
    monkeypatch.setitem(T.BUILTIN, "textcraft", tmp_path / "gone.model")
    with pytest.raises(FileNotFoundError, match="python -m sera_jax.warmstart.tokenizer"):
        T.resolve_tokenizer("builtin:textcraft", None)
