"""The built-in registrations: every dotted path names something that exists, and the registry stays light enough
for env worker processes (no JAX)."""

from __future__ import annotations

import subprocess
import sys

import pytest

from sera_jax.agents.environments import environment, names, resolve
from sera_jax.agents.envs import runtime_factories

REFS = ("open_world", "root_episode", "compact_score_request", "launch_spans", "load_tasks", "task_set_error",
        "warmstart_oracle", "demo_version", "warmstart_recipe", "worker_factory")


@pytest.mark.parametrize("name", names())
def test_every_reference_of_a_builtin_resolves(name):
    env = environment(name)
    for field in REFS:
        if getattr(env, field) is not None:
            assert resolve(getattr(env, field)) is not None, field
    assert callable(env.get("open_world")) and callable(env.get("launch_spans"))


def test_worker_factories_and_defaults():
    assert set(runtime_factories()) == {"textcraft", "textworld_sync"}
    assert environment(None).name == "textcraft"
    assert environment("textcraft").needs_pool and not environment("textworld_sync").needs_pool


def test_the_registry_imports_no_jax():
    code = "import sys, sera_jax.agents.envs, sera_jax.agents.environments; print('jax' in sys.modules)"
    assert subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          check=True).stdout.strip() == "False"
