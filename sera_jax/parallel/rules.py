"""Logical axis names → mesh axes, in one place, for training and for sampling.

Model code names only logical axes (``vocab``, ``embed``, ``heads``, ``kv_heads``, ``head_dim``, ``mlp``,
``layers``, ``norm`` for parameters; ``batch``, ``length``, ``act_*`` for activations). These tables say where each
goes on the ``(data, fsdp, tensor)`` mesh:

* training: parameters, gradients and optimizer state are fully sharded over ``fsdp`` (on the ``embed`` axis) and
  tensor-parallel over ``tensor`` (heads / mlp / vocab); the batch is split over ``data`` × ``fsdp``.
* sampling: a bf16 replica per ``data`` group (``embed`` unsharded), tensor-parallel over ``tensor``.
"""

from __future__ import annotations

import math
from typing import Any, Sequence

import flax.linen as nn
import jax
from jax.sharding import Mesh, NamedSharding, PartitionSpec

Rules = Sequence[tuple[str, Any]]

# Tensor parallelism is the same in both layouts: heads, kv heads, the MLP and the vocabulary over ``tensor``.
_TENSOR_PARALLEL: Rules = (
    ("length", None),
    ("vocab", "tensor"),
    ("heads", "tensor"),
    ("kv_heads", "tensor"),
    ("head_dim", None),
    ("mlp", "tensor"),
    ("layers", None),
    ("norm", None),
    ("act_embed", None),
    ("act_heads", "tensor"),
    ("act_kv_heads", "tensor"),
    ("act_mlp", "tensor"),
)

# Training: batch over data × fsdp, every parameter's embed axis over fsdp (ZeRO-3 style).
TRAIN_RULES: Rules = (("batch", ("data", "fsdp")), ("embed", "fsdp")) + _TENSOR_PARALLEL

# Sampling: a replica per data group (embed unsharded); the paged KV pool's blocks are replicated per data group and
# its kv heads split over tensor.
SAMPLE_RULES: Rules = (("batch", "data"), ("embed", None)) + _TENSOR_PARALLEL + (
    ("cache_blocks", None),
    ("cache_kv_heads", "tensor"),
)


def mesh_spec(logical: PartitionSpec | Sequence[str | None], rules: Rules) -> PartitionSpec:
    """Returns the mesh ``PartitionSpec`` for a sequence of logical axis names under ``rules``."""
    return nn.logical_to_mesh_axes(tuple(logical), rules)


def _axes_size(mesh: Mesh, axes) -> int:
    if axes is None:
        return 1
    if isinstance(axes, str):
        axes = (axes,)
    return math.prod(mesh.shape[a] for a in axes)


def check_divisible(shapes, logical_specs, mesh: Mesh, rules: Rules) -> None:
    """Raises ValueError naming every array dimension the mesh does not divide (param path, dim, axes, sizes)."""
    problems = []
    flat_shapes = jax.tree_util.tree_flatten_with_path(shapes)[0]
    flat_specs = jax.tree_util.tree_leaves(logical_specs, is_leaf=lambda x: isinstance(x, PartitionSpec))
    for (path, leaf), logical in zip(flat_shapes, flat_specs):
        spec = mesh_spec(logical, rules)
        for dim, (size, axes, name) in enumerate(zip(leaf.shape, spec, logical)):
            n = _axes_size(mesh, axes)
            if size % n:
                problems.append(
                    f"{jax.tree_util.keystr(path)} dim {dim} (logical '{name}', size {size}) is not divisible by "
                    f"mesh axes {axes} of total size {n}")
    if problems:
        raise ValueError("the mesh does not divide these dimensions (choose mesh sizes that divide them, or map "
                         "the logical axis to other mesh axes):\n  " + "\n  ".join(problems))


def shardings(logical_specs, mesh: Mesh, rules: Rules):
    """Returns a tree of ``NamedSharding`` for a tree of logical ``PartitionSpec``s."""
    return jax.tree.map(lambda spec: NamedSharding(mesh, mesh_spec(spec, rules)), logical_specs,
                        is_leaf=lambda x: isinstance(x, PartitionSpec))
