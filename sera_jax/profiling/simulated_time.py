"""The simulated device's clock: each engine program takes the roofline time ``projection`` gives its shapes on a
target GPU (``targets``), the same FLOP and byte counts the projection of a paper run uses.

* A prefill call of B × T computed tokens: ``projection.prefill_roofline`` (the FLOP peak for 2·N per computed token
  plus the causal attention over each real row's cached and new positions, or the weights and the K/V read and
  written at HBM bandwidth, whichever is longer).
* A decode chunk: each step it ran is ``projection.decode_roofline`` of its B rows at that step's mean context (the
  weights and every row's K/V read once), summed over the steps.

The start program (sampling a prefill's first tokens) is counted in its prefill: a sort of B × V logits is far below
the rest. A roofline is a floor: a real GPU's programs take longer (kernel launches, imperfect overlap), so a
simulated run's device time is the least a real one could take.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from sera_jax.model import Qwen3Config
from sera_jax.profiling.projection import decode_roofline, prefill_roofline
from sera_jax.profiling.targets import GpuTarget, get_target


@dataclasses.dataclass(frozen=True)
class RooflineTimer:
    """A ``sampling.simulation.ProgramTimer``: seconds of a program of the model ``cfg`` on ``gpu`` at the
    roofline, K/V and weights ``itemsize`` bytes per element."""

    cfg: Qwen3Config
    gpu: GpuTarget
    itemsize: int = 2

    @property
    def target(self) -> str:
        return self.gpu.name

    def prefill_s(self, rows: int, length: int, ctx_len: np.ndarray, new_len: np.ndarray) -> float:
        """Returns the seconds of one prefill call (see the module docstring)."""
        ctx, new = np.asarray(ctx_len, np.float64), np.asarray(new_len, np.float64)
        # Token j of a row's new ones attends to its ctx cached positions and the j new ones before it.
        attended = float(np.sum(new * ctx + new * (new - 1) / 2))
        return prefill_roofline(self.cfg, self.gpu, rows * length, attended, float(ctx.sum()), float(new.sum()),
                                self.itemsize)

    def decode_s(self, rows: int, context_sums: np.ndarray) -> float:
        """Returns the seconds of one decode chunk that ran ``len(context_sums)`` steps over ``rows`` rows."""
        return float(sum(decode_roofline(self.cfg, self.gpu, rows, float(c) / rows, self.itemsize)[0]
                         for c in np.asarray(context_sums)))


def roofline_timer(target: str):
    """Returns ``timer(model_cfg, itemsize) -> RooflineTimer`` on the shipped GPU ``target`` (h200, h100); raises
    ValueError naming the known targets."""
    gpu = get_target(target)
    return lambda cfg, itemsize=2: RooflineTimer(cfg, gpu, itemsize)
