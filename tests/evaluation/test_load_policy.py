"""Which policy ``sera-eval`` evaluates when given no checkpoint: the tiny default's (its warm start), not a random
initialisation; a random init only when the config names no warm start."""

from __future__ import annotations

from pathlib import Path

import jax
import numpy as np

from sera_jax.config import load_config
from sera_jax.evaluation.protocol import load_policy
from sera_jax.model import load_pretrained
from sera_jax.warmstart.sft import SHIPPED_DIR

CONFIG = Path(__file__).resolve().parents[2] / "configs" / "tiny_cpu.yaml"


def test_no_checkpoint_means_the_shipped_warm_start(tmp_path):
    cfg = load_config([CONFIG], [f"model.init_from={tmp_path / 'no_warmstart_built_yet'}"])
    policy = load_policy(cfg)
    assert policy.source == f"hf {SHIPPED_DIR}"
    _, shipped = load_pretrained(SHIPPED_DIR)
    for a, b in zip(jax.tree.leaves(policy.params), jax.tree.leaves(shipped)):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


def test_another_recipe_or_no_warm_start_is_a_random_init(tmp_path):
    none = load_policy(load_config([CONFIG], ["model.init_from=null"]))
    assert none.source.startswith("random init")
    other = load_policy(load_config([CONFIG], [f"model.init_from={tmp_path / 'x'}", "warmstart.seed=99"]))
    assert other.source.startswith("random init")  # the shipped weights were built from another recipe
