"""The CISPO train step compiled for a described GPU mesh, without the GPUs: memory plan and collective inventory.

The step is the trainer's own (``training.step.make_train_step``) lowered on abstract arguments — the train state's
``ShapeDtypeStruct``s in their FSDP layout, micro-batches of a config's shape — against deviceless devices
(``profiling.targets``), with the Pallas kernels selected (``kernels._common.target_backend``). Nothing is
allocated; a 4B step's plan and optimised HLO come from a CPU host.
"""

from __future__ import annotations

import dataclasses
import time
from typing import Any, Sequence

import jax
import jax.numpy as jnp
import optax
from jax.sharding import Mesh

from sera_jax.kernels._common import target_backend
from sera_jax.model import Qwen3Config, abstract_params
from sera_jax.parallel.mesh import activate
from sera_jax.parallel.rules import TRAIN_RULES, Rules
from sera_jax.profiling import fsdp, hlo
from sera_jax.rl.batch import MicroBatch
from sera_jax.rl.shapes import bucket_length, rows_per_micro_batch
from sera_jax.rl.losses import StepConfig
from sera_jax.training.step import (
    abstract_micro_batch,
    batch_axis_size,
    batch_shardings,
    init_train_state,
    make_train_step,
    train_state_shardings,
)

MEMORY_FIELDS = ("argument", "output", "alias", "temp")


@dataclasses.dataclass
class CompiledProgram:
    """What one deviceless compile reports: per-device memory (bytes) and the optimised HLO."""

    name: str
    compile_s: float
    memory: dict[str, int]            # argument, output, alias, temp, and peak = argument + output − alias + temp
    hlo_text: str
    executable: Any = dataclasses.field(default=None, repr=False)

    def gib(self, field: str = "peak") -> float:
        return self.memory[field] / 2**30


def memory_of(compiled) -> dict[str, int]:
    """Returns a compiled executable's per-device memory plan in bytes (``peak``: live at once at most)."""
    ma = compiled.memory_analysis()
    mem = {k: int(getattr(ma, f"{k}_size_in_bytes")) for k in MEMORY_FIELDS}
    mem["peak"] = mem["argument"] + mem["output"] - mem["alias"] + mem["temp"]
    return mem


def abstract_train_state(model_cfg: Qwen3Config, tx: optax.GradientTransformation, mesh: Mesh,
                         rules: Rules = TRAIN_RULES):
    """Returns the train state as ``ShapeDtypeStruct``s carrying their FSDP shardings (nothing allocated)."""
    shape = jax.eval_shape(lambda p: init_train_state(p, tx), abstract_params(model_cfg))
    sh = train_state_shardings(shape, model_cfg, mesh, rules)
    return jax.tree.map(lambda s, x: jax.ShapeDtypeStruct(s.shape, s.dtype, sharding=x), shape, sh)


def abstract_batch(mesh: Mesh, micro: int, rows: int, row_len: int, rules: Rules = TRAIN_RULES) -> MicroBatch:
    """Returns stacked micro-batches [micro, rows, row_len] as ``ShapeDtypeStruct``s in the step's layout."""
    return abstract_micro_batch((micro, rows, row_len), batch_shardings(mesh, rules))


def step_shapes(token_budget: int, buckets: Sequence[int], context_tokens: int, batch_split: int
                ) -> list[tuple[int, int]]:
    """Returns the (rows, row_len) of the micro-batches the loop can build: every bucket up to the one holding a
    whole context, ``max(1, token_budget // T)`` rows per device of the mesh's batch split (``rl.shapes``)."""
    longest = bucket_length(context_tokens, buckets)
    out = []
    for t in sorted(b for b in buckets if b <= longest):
        out.append((rows_per_micro_batch(token_budget, t, batch_split), t))
    return out


@dataclasses.dataclass
class StepCompile:
    """A compiled step at one shape, with its collective inventory against FSDP's minimum."""

    rows: int
    row_len: int
    micro: int
    program: CompiledProgram
    collectives: list[hlo.Collective]
    inventory: dict[str, dict[str, float]]
    minimum: dict[str, dict[str, float]]
    weight_sized: list[str]                # in-host all-reduces of weight size: must be empty
    triton_kernels: int                    # Pallas (Triton) custom calls in the optimised HLO

    @property
    def traffic(self) -> float:
        return fsdp.total(self.inventory)

    @property
    def ratio(self) -> float:
        """Collective bytes over FSDP's minimum."""
        return self.traffic / max(1.0, fsdp.total(self.minimum))


def compile_step(model_cfg: Qwen3Config, tx: optax.GradientTransformation, step_cfg: StepConfig, mesh: Mesh, *,
                 rows: int, row_len: int, micro: int = 1, devices_per_host: int, rules: Rules = TRAIN_RULES,
                 keep_executable: bool = False, weight_sized_elements: int = hlo.WEIGHT_SIZED_ELEMENTS
                 ) -> StepCompile:
    """Returns the step compiled for ``mesh``'s devices at [micro, rows, row_len], with its collectives."""
    if rows % batch_axis_size(mesh, rules):
        raise ValueError(f"{rows} rows do not split over the mesh's batch axes ({batch_axis_size(mesh, rules)})")
    state = abstract_train_state(model_cfg, tx, mesh, rules)
    batch = abstract_batch(mesh, micro, rows, row_len, rules)
    step = make_train_step(model_cfg, tx, step_cfg, mesh=mesh, rules=rules, state=state)
    t0 = time.perf_counter()
    with target_backend("gpu"), activate(mesh, rules):
        compiled = step.jitted.lower(state, batch).compile()
    prog = CompiledProgram(f"train_step[{micro}x{rows}x{row_len}]", time.perf_counter() - t0, memory_of(compiled),
                           compiled.as_text(), compiled if keep_executable else None)
    colls = hlo.collectives(prog.hlo_text, mesh.size, devices_per_host)
    heavy = [c.describe() for c in colls
             if c.kind == "all-reduce" and c.largest_elements >= weight_sized_elements
             and any(len({d // devices_per_host for d in g}) < len(g) for g in c.groups)]
    shape = dict(mesh.shape)
    minimum = fsdp.fsdp_minimum(model_cfg.num_params(), fsdp=shape.get("fsdp", 1), data=shape.get("data", 1),
                                micro=micro, compute_itemsize=jnp.dtype(model_cfg.compute_dtype).itemsize)
    return StepCompile(rows, row_len, micro, prog, colls, hlo.inventory(colls), minimum, heavy,
                       prog.hlo_text.count("__triton"))
