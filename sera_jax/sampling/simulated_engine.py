"""A rollout engine on a simulated device: the real host path, the device programs replaced by a model of their time.

``SimulatedEngine`` is an ``Engine`` whose driver thread, inbox, scheduler, block manager, prefix cache, chunked
decode rounds, stop handling and device clock are the engine's own; only ``prefill`` / ``start`` / ``decode`` are
``simulated_programs``' numpy stand-ins, which take the time a ``ProgramTimer`` (the profiling room's roofline on a
target GPU) gives their shapes and emit the tokens of a script. It holds no weights and no KV pool: a 4B policy's
host side can run at full scale on a machine that could not run the model.

Every finished turn is what the script says, shaped by the engine's real stop handling, so environments, sandboxes,
delegations, rubric and score calls run behind it as they would behind a policy that behaved like the script; the
simulation changes only time. Its outputs must say they are simulated (``simulation.label``).

    engine = SimulatedEngine(model_cfg, engine_config, timer=roofline_timer(model_cfg, 2), emission=script,
                             tokenizer=tok)
    result = await engine.generate(prompt_ids, params, key=key)
"""

from __future__ import annotations

import time
from typing import Any, Sequence

import jax
import numpy as np

from sera_jax.model.config import Qwen3Config
from sera_jax.parallel.mesh import MeshConfig, make_mesh
from sera_jax.parallel.rules import SAMPLE_RULES
from sera_jax.sampling.engine import Engine
from sera_jax.sampling.engine_config import EngineConfig
from sera_jax.sampling.scheduler import Scheduler
from sera_jax.sampling.simulated_programs import SimRowState, SimulatedPrograms
from sera_jax.sampling.simulation import Emission, ProgramTimer
from sera_jax.sampling.types import GenerationResult, SamplingParams


class SimulatedEngine(Engine):
    """An ``Engine`` on a simulated device (see the module docstring). ``params`` are accepted and ignored."""

    def __init__(self, cfg: Qwen3Config, params: Any = None, config: EngineConfig | None = None, *,
                 timer: ProgramTimer, emission: Emission, mesh: Any = None, tokenizer: Any = None, seed: int = 0,
                 **_: Any):
        self.config = config = config or EngineConfig()
        self.model_cfg = cfg
        self.cfg = cfg.replace(dtype=config.dtype, param_dtype=config.dtype, remat=False)
        self.mesh = mesh or make_mesh(MeshConfig(1, 1, 1), jax.local_devices()[:1])
        self.rules = SAMPLE_RULES
        self.tokenizer = tokenizer
        self.seed = int(seed) & 0xFFFFFFFF
        self.buckets = config.buckets(1)
        self.sched = Scheduler(config, self.buckets, tokenizer.decode if tokenizer is not None else None)
        self.programs = SimulatedPrograms(timer, self.sched.slots, config.chunk_steps)
        self._prefill, self._start, self._decode = (self.programs.prefill, self.programs.start,
                                                    self.programs.decode)
        self.target = timer.target
        self.emission = emission
        self.params = self.pool = None
        self.state = SimRowState.empty(self.sched.rows, config.stop_seq_len)
        self._init_driver()
        self._emitted: tuple[np.ndarray, np.ndarray] | None = None
        self.script_s = 0.0      # CPU seconds the script took on the callers' loop (a simulation cost, not the host's)

    async def generate(self, prompt_ids: Sequence[int], params: SamplingParams | None = None,
                       key: jax.Array | None = None, *, on_progress: Any = None) -> GenerationResult:
        """``Engine.generate`` whose turn emits the script's tokens for this call (see the module docstring)."""
        t0 = time.thread_time()
        ids, lps = self.emission(prompt_ids, SamplingParams() if params is None else params, key)
        self.script_s += time.thread_time() - t0
        if not len(ids):
            raise ValueError("the simulation's script emitted no token")
        # Handed to the request in _submit, which Engine.generate reaches without awaiting anything first.
        self._emitted = (np.asarray(ids, np.int32), np.asarray(lps, np.float32))
        return await super().generate(prompt_ids, params, key, on_progress=on_progress)

    def _submit(self, msg) -> None:
        if msg[0] == "add":
            msg[1].sim, self._emitted = self._emitted, None
        super()._submit(msg)

    def load_weights(self, params: Any = None, *, owned: bool = False) -> int:
        """Bumps the policy version and empties the prefix cache, as a publish does; the weights are not kept."""
        with self._lock:
            self.sched.new_weights()
            return self.sched.version

    def warmup(self) -> int:
        """Nothing to compile; returns 0."""
        return 0

    def warm_publish(self, params: Any) -> None:
        """Nothing to compile."""

    def compile_count(self) -> int:
        return 0

    def _collect(self) -> dict:
        s = super()._collect()
        dev = self.programs.device
        s.update(simulated_busy_s=dev.busy_s, simulated_prefill_s=dev.program_s["prefill"],
                 simulated_decode_s=dev.program_s["decode"], script_s=self.script_s,
                 simulated_programs_cpu_s=self.programs.cpu_s)
        return s
