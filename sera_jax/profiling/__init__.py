"""Profiling the sharded train step and the engine's decode chunks: timings, MFU, peak memory, profiler traces.

``sera-profile`` (``sera_jax.cli.profile``) and ``tools/profile_train_step.py`` are thin front ends.
"""

from sera_jax.profiling.flops import HBM_BYTES_PER_S, PEAK_FLOPS, decode_flops, peak_memory_bytes, train_flops
from sera_jax.profiling.trace import profiler_trace, trace_files

__all__ = ["HBM_BYTES_PER_S", "PEAK_FLOPS", "decode_flops", "peak_memory_bytes", "train_flops",
           "profiler_trace", "trace_files"]
