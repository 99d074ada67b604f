"""Device meshes with axes (data, fsdp, tensor), single- and multi-host, and the context that activates rules.

Multi-host (e.g. 2 hosts × 8 H200): every command starts the job's runtime first (``parallel.hosts.
start_distributed``, from ``SERA_COORDINATOR`` / ``SERA_NUM_PROCESSES`` / ``SERA_PROCESS_ID``; the
``initialize_distributed`` below takes them as arguments); ``make_mesh`` then lays ``dcn_data`` host groups along the
data axis (slow inter-host links carry only the data-parallel gradient reduction) and fsdp × tensor within each host
over NVLink.
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
import os
from typing import Any, Iterator

import flax.linen as nn
import jax
import numpy as np
from jax.experimental import mesh_utils
from jax.sharding import Mesh

from sera_jax.parallel.rules import Rules

AXES = ("data", "fsdp", "tensor")


@dataclasses.dataclass(frozen=True)
class MeshConfig:
    """Mesh sizes; one of data / fsdp / tensor may be -1 (= whatever the device count leaves).

    ``dcn_data`` is the number of hosts (process groups) laid along ``data``; ``data`` counts all of them.
    """

    data: int = 1
    fsdp: int = -1
    tensor: int = 1
    dcn_data: int = 1

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "MeshConfig":
        unknown = set(d) - {f.name for f in dataclasses.fields(cls)}
        if unknown:
            raise ValueError(f"unknown mesh keys {sorted(unknown)}; allowed: data, fsdp, tensor, dcn_data")
        return cls(**{k: int(v) for k, v in d.items()})

    def resolve(self, num_devices: int) -> tuple[int, int, int]:
        """Returns concrete (data, fsdp, tensor) sizes for ``num_devices``, or raises ValueError saying why not."""
        sizes = [self.data, self.fsdp, self.tensor]
        if sizes.count(-1) > 1:
            raise ValueError(f"at most one mesh axis may be -1, got data={self.data} fsdp={self.fsdp} "
                             f"tensor={self.tensor}")
        if any(s == 0 or s < -1 for s in sizes):
            raise ValueError(f"mesh sizes must be positive or -1, got {sizes}")
        known = math.prod(s for s in sizes if s != -1)
        if -1 in sizes:
            if num_devices % known:
                raise ValueError(f"{num_devices} devices cannot be split into a mesh with fixed axes of total "
                                 f"size {known} ({dict(zip(AXES, sizes))})")
            sizes[sizes.index(-1)] = num_devices // known
        if math.prod(sizes) != num_devices:
            raise ValueError(f"mesh {dict(zip(AXES, sizes))} has {math.prod(sizes)} devices, but {num_devices} "
                             "are available")
        if sizes[0] % self.dcn_data:
            raise ValueError(f"data={sizes[0]} must be a multiple of dcn_data={self.dcn_data} (hosts)")
        return tuple(sizes)


def make_mesh(cfg: MeshConfig | None = None, devices=None) -> Mesh:
    """Returns a ``Mesh`` over ``devices`` (default: all) with axes (data, fsdp, tensor)."""
    cfg = cfg or MeshConfig()
    devices = list(jax.devices() if devices is None else devices)
    data, fsdp, tensor = cfg.resolve(len(devices))
    if cfg.dcn_data > 1:
        per_host = (data // cfg.dcn_data, fsdp, tensor)
        # On GPU/CPU every device reports slice 0: the "granules" along the slow axis are processes (hosts).
        slices = {getattr(d, "slice_index", 0) for d in devices}
        grid = mesh_utils.create_hybrid_device_mesh(per_host, (cfg.dcn_data, 1, 1), devices=devices,
                                                    process_is_granule=len(slices) != cfg.dcn_data)
    else:
        try:
            grid = mesh_utils.create_device_mesh((data, fsdp, tensor), devices=devices)
        except (ValueError, NotImplementedError, AssertionError):
            grid = np.asarray(devices).reshape(data, fsdp, tensor)
    return Mesh(grid, AXES)


def initialize_distributed(coordinator_address: str | None = None, num_processes: int | None = None,
                           process_id: int | None = None) -> bool:
    """Starts JAX's multi-host runtime when more than one process is configured; returns whether it did.

    Must run before any other JAX call in each process. Arguments fall back to ``SERA_COORDINATOR``,
    ``SERA_NUM_PROCESSES`` and ``SERA_PROCESS_ID``.
    """
    coordinator_address = coordinator_address or os.environ.get("SERA_COORDINATOR")
    if num_processes is None and "SERA_NUM_PROCESSES" in os.environ:
        num_processes = int(os.environ["SERA_NUM_PROCESSES"])
    if process_id is None and "SERA_PROCESS_ID" in os.environ:
        process_id = int(os.environ["SERA_PROCESS_ID"])
    if not coordinator_address and (num_processes or 1) <= 1:
        return False
    if coordinator_address and (num_processes is None or process_id is None):
        raise ValueError("multi-host needs num_processes and process_id with coordinator_address "
                         "(or SERA_NUM_PROCESSES / SERA_PROCESS_ID)")
    jax.distributed.initialize(coordinator_address=coordinator_address, num_processes=num_processes,
                               process_id=process_id)
    return True


@contextlib.contextmanager
def activate(mesh: Mesh, rules: Rules) -> Iterator[Mesh]:
    """Context in which ``mesh`` is the ambient mesh and ``rules`` resolve logical activation constraints."""
    with jax.set_mesh(mesh), nn.logical_axis_rules(rules):
        yield mesh
