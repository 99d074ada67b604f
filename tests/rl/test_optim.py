"""The learning-rate schedule of the optax chain: the reference's warm-up then constant rate, and the optional linear
decay to 0 (``optim.decay_steps``) the tiny CPU default uses."""

from __future__ import annotations

import numpy as np
import pytest

from sera_jax.rl.optim import OptimConfig, learning_rate


def _rates(cfg, n):
    sched = learning_rate(cfg)
    return np.array([float(sched(i)) for i in range(n)])


def test_warmup_then_constant_is_the_reference_formula():
    np.testing.assert_allclose(_rates(OptimConfig(lr=1e-3, warmup_steps=1), 4), [0.0, 1e-3, 1e-3, 1e-3])
    np.testing.assert_allclose(_rates(OptimConfig(lr=1e-3, warmup_steps=2), 4), [0.0, 5e-4, 1e-3, 1e-3])
    np.testing.assert_allclose(_rates(OptimConfig(lr=1e-3, warmup_steps=0), 3), [1e-3] * 3)


def test_linear_decay_to_zero():
    np.testing.assert_allclose(_rates(OptimConfig(lr=2e-4, warmup_steps=0, decay_steps=4), 6),
                               [2e-4, 1.5e-4, 1e-4, 5e-5, 0.0, 0.0], atol=1e-12)
    np.testing.assert_allclose(_rates(OptimConfig(lr=2e-4, warmup_steps=1, decay_steps=2), 5),
                               [0.0, 2e-4, 1e-4, 0.0, 0.0], atol=1e-12)
    with pytest.raises(ValueError, match="decay_steps must be ≥ 1"):
        OptimConfig(decay_steps=0)
