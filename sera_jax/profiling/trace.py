"""``jax.profiler`` traces written where TensorBoard/XProf and Perfetto can open them.

``jax.profiler.trace(log_dir, create_perfetto_trace=True)`` writes ``log_dir/plugins/profile/<run>/`` holding
``<host>.xplane.pb`` (TensorBoard's profile plugin / XProf: ``tensorboard --logdir log_dir`` or
``xprof --logdir log_dir``), ``<host>.trace.json.gz`` and ``perfetto_trace.json.gz`` (drop it on
https://ui.perfetto.dev).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path

TRACE_SUFFIXES = (".xplane.pb", ".trace.json.gz", "perfetto_trace.json.gz")


@contextlib.contextmanager
def profiler_trace(log_dir: str | Path | None) -> Iterator[Path | None]:
    """Context that traces everything inside it into ``log_dir`` (nothing when None); yields the directory."""
    if log_dir is None:
        yield None
        return
    import jax

    path = Path(log_dir)
    path.mkdir(parents=True, exist_ok=True)
    with jax.profiler.trace(str(path), create_perfetto_trace=True):
        yield path


def trace_files(log_dir: str | Path) -> list[Path]:
    """Returns the trace files under ``log_dir`` (xplane protobufs and JSON traces), sorted."""
    root = Path(log_dir)
    if not root.is_dir():
        return []
    return sorted(p for p in root.rglob("*") if p.is_file() and p.name.endswith(TRACE_SUFFIXES))
