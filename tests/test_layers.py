"""The house's layering is a checked contract (pyproject.toml's [tool.importlinter]): the repository keeps it, and an
upward import — at module level or inside a function — breaks it."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
LINT = shutil.which("lint-imports") or str(Path(sys.executable).with_name("lint-imports"))


def _lint(cwd: Path) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=str(cwd))  # the copy in cwd shadows the installed package
    return subprocess.run([LINT], cwd=cwd, env=env, capture_output=True, text=True, timeout=300)


def test_repository_keeps_the_contracts():
    out = _lint(ROOT)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "BROKEN" not in out.stdout and out.stdout.count("KEPT") == 2


@pytest.fixture
def copy(tmp_path: Path) -> Path:
    ignore = shutil.ignore_patterns("__pycache__", "assets")
    for pkg in ("sera_jax", "envs_py"):
        shutil.copytree(ROOT / pkg, tmp_path / pkg, ignore=ignore)
    shutil.copy(ROOT / "pyproject.toml", tmp_path / "pyproject.toml")
    return tmp_path


@pytest.mark.parametrize("module, statement, broken", [
    # config must not reach up into training (the StepConfig knot this contract replaced).
    ("sera_jax/config/validate.py", "from sera_jax.training.build import build_loop",
     "sera_jax.config.validate -> sera_jax.training.build"),
    # assembly sits below training, evaluation and warm start.
    ("sera_jax/assembly/engines.py", "import sera_jax.evaluation.protocol",
     "sera_jax.assembly.engines -> sera_jax.evaluation.protocol"),
    # parallel knows no model.
    ("sera_jax/parallel/rules.py", "from sera_jax.model import Qwen3Config",
     "sera_jax.parallel.rules -> sera_jax.model"),
    # environments know no JAX and no agents.
    ("envs_py/core.py", "import jax", "envs_py.core -> jax"),
    ("envs_py/textworld_sync/world.py", "from sera_jax.agents import records",
     "envs_py.textworld_sync.world -> sera_jax.agents"),
])
def test_an_upward_import_inside_a_function_breaks_the_contract(copy: Path, module: str, statement: str, broken: str):
    assert _lint(copy).returncode == 0  # the unmodified copy passes
    path = copy / module
    path.write_text(path.read_text() + f"\n\ndef _upward():\n    {statement}\n")
    out = _lint(copy)
    assert out.returncode != 0
    assert "BROKEN" in out.stdout and broken in out.stdout, out.stdout
