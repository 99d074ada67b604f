"""A ``sera-serve`` process on the shipped warm start (imported with ``sera-export --import``), shared by a module."""

from __future__ import annotations

import pytest

from sera_jax.interop.export import import_pretrained
from sera_jax.serving.process import serve_process
from sera_jax.warmstart.sft import SHIPPED_DIRS

SERVE_FLAGS = ("--max-batch", "8", "--max-context", "1024", "--max-tokens", "512")


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    """A run directory made by ``sera-export --import`` from the shipped TextCraft warm start."""
    return import_pretrained(SHIPPED_DIRS["textcraft"], tmp_path_factory.mktemp("serve") / "tiny_run")


@pytest.fixture(scope="module")
def server(run_dir):
    proc = serve_process([str(run_dir)], *SERVE_FLAGS)
    yield proc
    proc.stop()
