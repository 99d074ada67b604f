"""The CLIs' persistent compilation cache: on by default in a user's home, off with 0, never over an explicit dir."""

from __future__ import annotations

import jax

from sera_jax.cli.common import use_compilation_cache


def test_compilation_cache_setting(monkeypatch, tmp_path):
    before = jax.config.jax_compilation_cache_dir
    try:
        jax.config.update("jax_compilation_cache_dir", None)
        monkeypatch.setenv("SERA_JAX_COMPILATION_CACHE", "0")
        assert use_compilation_cache() is None and jax.config.jax_compilation_cache_dir is None
        # "1" is a switch (the default directory in the home), not a directory named "1" wherever the run started.
        monkeypatch.setenv("HOME", str(tmp_path / "home"))
        monkeypatch.setenv("SERA_JAX_COMPILATION_CACHE", "1")
        assert use_compilation_cache() == str(tmp_path / "home" / ".cache" / "sera_jax" / "xla")
        jax.config.update("jax_compilation_cache_dir", None)
        monkeypatch.setenv("SERA_JAX_COMPILATION_CACHE", str(tmp_path / "xla"))
        assert use_compilation_cache() == str(tmp_path / "xla") == jax.config.jax_compilation_cache_dir
        # An explicit directory (e.g. $JAX_COMPILATION_CACHE_DIR) wins over ours.
        monkeypatch.setenv("SERA_JAX_COMPILATION_CACHE", str(tmp_path / "other"))
        assert use_compilation_cache() == str(tmp_path / "xla")
    finally:
        jax.config.update("jax_compilation_cache_dir", before)
