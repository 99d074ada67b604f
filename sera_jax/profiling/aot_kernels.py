"""Every Pallas kernel compiled on its own for a described GPU, at the shapes the train step and the engine use, and
checked to hold an sm_90 cubin.

A Pallas kernel inside a jitted program is a ``__gpu$xla.gpu.triton`` custom call; compiling the program for a CUDA
target runs Triton and the PTX assembler, and the serialised executable (``jax.experimental.serialize_executable``)
carries the resulting CUDA ELF images (OS ABI 0x41) whose build notes name the architecture (``-arch sm_90a`` on
Hopper). Each case here is a small program around one call site — the training attention's forward and backward,
the engine's prefill and decode attention — so what it holds is that kernel's.
"""

from __future__ import annotations

import dataclasses
import re
import time
from typing import Any, Callable, Iterable

import jax
import jax.numpy as jnp
from jax.sharding import SingleDeviceSharding

from sera_jax.kernels._common import target_backend
from sera_jax.kernels.flash_attention import flash_attention
from sera_jax.kernels.paged_attention import paged_attention
from sera_jax.model import Qwen3Config

CUDA_ELF = b"\x7fELF\x02\x01\x01A"   # 64-bit little-endian ELF with the CUDA OS ABI
_KERNEL_NAME = re.compile(r'custom_call_target="__gpu\$xla\.gpu\.triton".*?backend_config=\{.*?name = "([^"]+)"')


@dataclasses.dataclass(frozen=True)
class KernelCompile:
    """One kernel call site compiled for the target."""

    case: str                  # e.g. "train attention fwd+bwd [1, 10240]"
    kernels: tuple[str, ...]   # Pallas kernel names in the program (pallas_call name=)
    compile_s: float
    cuda_elfs: int             # CUDA ELF images in the serialised executable
    sm90: bool                 # the images were built for sm_90 (sm_90a)

    @property
    def ok(self) -> bool:
        return bool(self.kernels) and self.cuda_elfs >= 1 and self.sm90


def kernel_names(hlo_text: str) -> list[str]:
    """Returns the Pallas (Triton) kernel names called in an optimised HLO module, in order."""
    return [m.group(1) for line in hlo_text.splitlines() if "xla.gpu.triton" in line
            for m in [_KERNEL_NAME.search(line)] if m]


def _compile(case: str, fn: Callable, args: Iterable[Any]) -> KernelCompile:
    from jax.experimental import serialize_executable

    t0 = time.perf_counter()
    with target_backend("gpu"):
        compiled = jax.jit(fn).lower(*args).compile()
    secs = time.perf_counter() - t0
    blob, _, _ = serialize_executable.serialize(compiled)
    return KernelCompile(case, tuple(kernel_names(compiled.as_text())), secs, blob.count(CUDA_ELF),
                         b"sm_90" in blob)


def train_attention_case(cfg: Qwen3Config, rows: int, row_len: int, device) -> KernelCompile:
    """The packed training attention of one device's micro-batch rows: forward and backward kernels."""
    sh = SingleDeviceSharding(device)
    dt = cfg.compute_dtype
    q = jax.ShapeDtypeStruct((rows, row_len, cfg.num_heads, cfg.head_dim), dt, sharding=sh)
    kv = jax.ShapeDtypeStruct((rows, row_len, cfg.num_kv_heads, cfg.head_dim), dt, sharding=sh)
    seg = jax.ShapeDtypeStruct((rows, row_len), jnp.int32, sharding=sh)

    def fwd_bwd(q, k, v, s):
        return jax.grad(lambda q, k, v: flash_attention(q, k, v, s).astype(jnp.float32).sum(), argnums=(0, 1, 2))(
            q, k, v)

    return _compile(f"train attention fwd+bwd [{rows}, {row_len}]", fwd_bwd, (q, kv, kv, seg))


def engine_attention_case(cfg: Qwen3Config, *, rows: int, new_tokens: int, table_blocks: int, num_blocks: int,
                          block_size: int, device) -> KernelCompile:
    """The engine's paged attention of ``rows`` rows with ``new_tokens`` new tokens each (1: decode; more:
    prefill) over ``table_blocks`` cached blocks of a ``num_blocks`` pool of all layers."""
    sh = SingleDeviceSharding(device)
    dt = cfg.compute_dtype
    h, k, e = cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
    q = jax.ShapeDtypeStruct((rows, new_tokens, h, e), dt, sharding=sh)
    kv = jax.ShapeDtypeStruct((rows, new_tokens, k, e), dt, sharding=sh)
    pool = jax.ShapeDtypeStruct((cfg.num_layers, num_blocks, block_size, k, e), dt, sharding=sh)
    layer = jax.ShapeDtypeStruct((), jnp.int32, sharding=sh)
    table = jax.ShapeDtypeStruct((rows, table_blocks), jnp.int32, sharding=sh)
    lens = jax.ShapeDtypeStruct((rows,), jnp.int32, sharding=sh)
    kind = "decode" if new_tokens == 1 else "prefill"
    return _compile(f"engine {kind} attention [{rows}, {new_tokens}, {table_blocks} blocks]", paged_attention,
                    (q, kv, kv, pool, pool, layer, table, lens))
