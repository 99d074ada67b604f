"""GPU targets to compile for without the GPU: a device description (XLA's ``GpuTargetConfigProto`` text, shipped in
``targets/``), the peaks a projection divides by, and a deviceless topology of hosts × GPUs.

jax's CUDA plugin (``jax-cuda12-plugin`` and ``jax-cuda12-pjrt`` at exactly the installed jax version; the ``aot``
extra) installs on a CPU-only machine and needs no NVIDIA library to *compile*: ``jax.experimental.topologies``
returns GPU devices of the described kind, and ``jit(...).lower(...).compile()`` against them runs XLA's GPU
pipeline — SPMD partitioning, fusion, scheduling, Triton and the PTX assembler for Pallas kernels — producing an
executable for sm_90 that never runs here.
"""

from __future__ import annotations

import dataclasses
import importlib.metadata
from pathlib import Path
from typing import Any

TARGETS_DIR = Path(__file__).resolve().parent / "targets"
# XLA's GPU client preallocates this fraction of device memory for its allocator by default
# (XLA_PYTHON_CLIENT_MEM_FRACTION): what the programs, weights and the KV pool must fit in.
DEFAULT_MEM_FRACTION = 0.75


@dataclasses.dataclass(frozen=True)
class GpuTarget:
    """A GPU to compile for, with the public peak figures a roofline projection uses (per GPU)."""

    name: str
    proto_file: str            # in TARGETS_DIR
    memory_bytes: int          # device memory as the driver reports it
    bf16_flops: float          # dense bf16 tensor-core peak, FLOP/s
    hbm_bytes_per_s: float
    nvlink_bytes_per_s: float  # per GPU, one direction

    def proto(self) -> str:
        """Returns the GpuTargetConfigProto text (comments stripped)."""
        text = (TARGETS_DIR / self.proto_file).read_text()
        return "\n".join(line for line in text.splitlines() if not line.lstrip().startswith("#"))

    def bytes_limit(self, mem_fraction: float = DEFAULT_MEM_FRACTION) -> int:
        """Returns the bytes JAX's allocator may use on one device at ``mem_fraction``."""
        return int(self.memory_bytes * mem_fraction)


TARGETS = {
    "h200": GpuTarget("h200", "h200_sxm.txtpb", memory_bytes=150_754_820_096, bf16_flops=989e12,
                      hbm_bytes_per_s=4.8e12, nvlink_bytes_per_s=450e9),
    "h100": GpuTarget("h100", "h100_sxm.txtpb", memory_bytes=85_520_809_984, bf16_flops=989e12,
                      hbm_bytes_per_s=3.35e12, nvlink_bytes_per_s=450e9),
}


def get_target(name: str) -> GpuTarget:
    """Returns the shipped target ``name`` (h200, h100); raises ValueError naming the known ones."""
    try:
        return TARGETS[name]
    except KeyError:
        raise ValueError(f"unknown GPU target {name!r}; shipped: {', '.join(sorted(TARGETS))}") from None


class MissingCudaPlugin(RuntimeError):
    """jax's CUDA plugin is not installed (or not at the installed jax's version)."""


def check_plugin() -> str:
    """Returns the installed plugin version; raises MissingCudaPlugin saying what to install when it is absent or
    does not match jax."""
    import jax

    try:
        versions = {p: importlib.metadata.version(p) for p in ("jax-cuda12-plugin", "jax-cuda12-pjrt")}
    except importlib.metadata.PackageNotFoundError:
        versions = {}
    want = f'"jax-cuda12-plugin=={jax.__version__}" "jax-cuda12-pjrt=={jax.__version__}"'
    if len(versions) != 2:
        raise MissingCudaPlugin(f"the deviceless GPU compile needs jax's CUDA plugin (no NVIDIA libraries): "
                                f"pip install -e '.[aot]' or pip install {want}")
    if set(versions.values()) != {jax.__version__}:
        raise MissingCudaPlugin(f"jax is {jax.__version__} but the CUDA plugin is {versions}: pip install {want}")
    return jax.__version__


def topology_devices(target: GpuTarget, hosts: int, gpus_per_host: int) -> list[Any]:
    """Returns ``hosts × gpus_per_host`` deviceless GPU devices of ``target`` (host-major: device id // gpus_per_host
    is its host), to compile against."""
    check_plugin()
    from jax.experimental import topologies

    topo = topologies.get_topology_desc(f"sera-{target.name}", "cuda", target_config=target.proto(),
                                        topology=f"1x{hosts}x{gpus_per_host}")
    devices = list(topo.devices)
    if len(devices) != hosts * gpus_per_host:
        raise RuntimeError(f"topology 1x{hosts}x{gpus_per_host} gave {len(devices)} devices")
    for d in devices:
        if d.id // gpus_per_host != d.process_index:
            raise RuntimeError(f"device {d.id} is on host {d.process_index}, not {d.id // gpus_per_host}: the "
                               f"collective inventory's host attribution would be wrong")
    return devices
