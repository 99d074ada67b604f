"""Running a kernel on sharded activations: ``shard_map`` over the ambient mesh, specs from the logical axis rules.

XLA cannot partition a Pallas custom call: left alone inside a sharded ``jit``, its inputs would be gathered onto
every device and the kernel run on the whole batch everywhere. Attention is independent per row and per kv-head
group, so each device can run the kernel on its local rows and heads. The model names only logical axes; this
wrapper turns them into mesh axes with the rules active at trace time (``parallel.mesh.activate`` sets both the mesh
and the rules), so this package names no mesh axis either. Query heads and kv heads split over the same mesh axis
keep every group on one device (heads are grouped contiguously), so GQA stays local.
"""

from __future__ import annotations

import math
from typing import Callable, Sequence

import flax.linen as nn
import jax
from jax.sharding import PartitionSpec

Logical = Sequence[str | None] | None  # None: a replicated (e.g. scalar) argument


def _axis_size(mesh, axes) -> int:
    if axes is None:
        return 1
    return math.prod(mesh.shape[a] for a in ((axes,) if isinstance(axes, str) else axes))


# Names that must be split together or not at all: a query head and its kv head must land on the same device.
TIED = (("act_heads", "act_kv_heads", "cache_kv_heads"),)


def _name_axes(mesh, rules, in_logical, args) -> dict:
    """Returns {logical name: mesh axes or None}: a name keeps its mesh axes only if they divide every dimension
    carrying it (else that dimension stays whole on every device: correct, just redundant), and tied names agree."""
    keep = {}
    for logical, arg in zip(in_logical, args):
        if logical is None:
            continue
        mesh_axes = nn.logical_to_mesh_axes(tuple(logical), rules)
        for name, axes, dim in zip(logical, mesh_axes, jax.numpy.shape(arg)):
            if name is None:
                continue
            ok = axes is not None and dim % _axis_size(mesh, axes) == 0
            prev = keep.get(name, (axes, True))
            keep[name] = (axes, prev[1] and ok)
    for group in TIED:
        if not all(keep[n][1] for n in group if n in keep):
            for n in group:
                if n in keep:
                    keep[n] = (keep[n][0], False)
    return {n: (axes if ok else None) for n, (axes, ok) in keep.items()}


def _spec(names: dict, logical: Logical) -> PartitionSpec:
    if logical is None:
        return PartitionSpec()
    return PartitionSpec(*(None if n is None else names[n] for n in logical))


def logical_shard_map(fn: Callable, in_logical: Sequence[Logical], out_logical) -> Callable:
    """Returns ``fn`` run per device under the ambient mesh, or ``fn`` itself when no multi-device mesh or no
    logical rules are active. ``out_logical`` is one Logical or a tuple of them (matching fn's outputs); every
    logical name must also appear in some input, whose split it shares.
    """
    def wrapped(*args):
        mesh = jax.sharding.get_abstract_mesh()
        rules = nn.get_logical_axis_rules()
        if mesh.empty or mesh.size == 1 or not rules:
            return fn(*args)
        names = _name_axes(mesh, rules, in_logical, args)
        in_specs = tuple(_spec(names, lg) for lg in in_logical)
        single = out_logical is None or isinstance(out_logical[0], (str, type(None)))
        outs = [out_logical] if single else list(out_logical)
        out_specs = tuple(_spec(names, lg) for lg in outs)
        return jax.shard_map(fn, mesh=mesh, in_specs=in_specs, out_specs=out_specs[0] if single else out_specs,
                             check_vma=False)(*args)

    return wrapped


Q = ("batch", "length", "act_heads", "head_dim")
KV = ("batch", "length", "act_kv_heads", "head_dim")
ROWS = ("batch", "length")
POOL = ("layers", "cache_blocks", None, "cache_kv_heads", "head_dim")
TABLE = ("batch", None)
LENGTHS = ("batch",)
