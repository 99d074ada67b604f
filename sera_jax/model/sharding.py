"""Where Qwen3's parameters live on a mesh: the logical axes of ``param_logical_axes`` mapped by a rule set.

Here, not in ``parallel/``, because it names the model's parameters; ``parallel/`` knows meshes and rules only.
"""

from __future__ import annotations

import jax
from jax.sharding import Mesh

from sera_jax.model.config import Qwen3Config
from sera_jax.model.qwen3 import abstract_params, param_logical_axes
from sera_jax.parallel.rules import TRAIN_RULES, Rules, check_divisible, shardings


def param_shardings(cfg: Qwen3Config, mesh: Mesh, rules: Rules = TRAIN_RULES):
    """Returns ``NamedSharding``s for every Qwen3 parameter, after checking the mesh divides every dimension."""
    logical = param_logical_axes(cfg)
    check_divisible(abstract_params(cfg), logical, mesh, rules)
    return shardings(logical, mesh, rules)


def shard_params(params, cfg: Qwen3Config, mesh: Mesh, rules: Rules = TRAIN_RULES):
    """Returns ``params`` placed on ``mesh`` with the shardings the rules name."""
    return jax.device_put(params, param_shardings(cfg, mesh, rules))
