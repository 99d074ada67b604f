"""What a simulated device needs from the rooms above it: a model of its programs' time and a script of its tokens.

A simulated engine (``simulated_engine.SimulatedEngine``) keeps the real host path and replaces the device programs
with a model of their time on a target GPU. The time model is the profiling room's roofline
(``profiling.simulated_time``) and the tokens come from a script (the warm start's oracles), both of which live in
rooms above ``sampling``. A command that simulates (``--simulate h200``, ``engine.backend: simulated``) builds a
``Simulation`` from them and installs it in its process; the rooms below (``assembly``, ``training``) then build
simulated engines from the installed one without importing a room above them.

    install(Simulation("h200", timer=roofline_timer("h200"), script=oracle_script, bytes_limit=limit))
    simulation = installed()            # None when the process simulates nothing
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, Protocol, Sequence

import numpy as np
from jaxtyping import Int

from sera_jax.sampling.types import SamplingParams

# (prompt ids, sampling params, the turn's key) → (token ids, logprobs) the simulated device emits, one per position;
# called on the caller's event loop inside ``generate`` (so it may read the calling agent's context variables).
Emission = Callable[[Sequence[int], SamplingParams, Any], tuple[Sequence[int], Sequence[float]]]


class ProgramTimer(Protocol):
    """Seconds the target GPU takes for one device program of the engine, by its shapes."""

    target: str

    def prefill_s(self, rows: int, length: int, ctx_len: Int[np.ndarray, "B"], new_len: Int[np.ndarray, "B"]
                  ) -> float:
        """Returns the seconds of a prefill call of ``rows`` × ``length`` computed tokens whose real rows have
        ``ctx_len`` cached and ``new_len`` new tokens each."""

    def decode_s(self, rows: int, context_sums: Int[np.ndarray, "S"]) -> float:
        """Returns the seconds of a decode chunk of ``rows`` rows that ran ``len(context_sums)`` steps, step s
        attending to ``context_sums[s]`` cached positions over all rows."""


@dataclasses.dataclass(frozen=True)
class Simulation:
    """A simulated device: its target GPU's name, the timer of its programs for a model config
    (``timer(model_cfg, itemsize) -> ProgramTimer``) and the script of a run (``script(run_cfg, tokenizer) ->
    Emission``)."""

    target: str
    timer: Callable[[Any, int], ProgramTimer]
    script: Callable[[Any, Any], Emission]
    bytes_limit: int            # what the GPU's allocator may use (the engines' KV pools are sized from it)


_INSTALLED: list[Simulation] = []


def install(simulation: Simulation | None) -> None:
    """Makes ``simulation`` the process's simulated device (None: none)."""
    _INSTALLED[:] = [] if simulation is None else [simulation]


def installed() -> Simulation | None:
    """Returns the installed simulation, or None."""
    return _INSTALLED[0] if _INSTALLED else None


def label(simulation: Simulation | None = None) -> dict[str, str]:
    """Returns the label every output of a simulated run carries: {"simulated": target} (empty when the process
    simulates nothing)."""
    sim = simulation if simulation is not None else installed()
    return {} if sim is None else {"simulated": sim.target}
