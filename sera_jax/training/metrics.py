"""Per-step metrics: one JSON line per record and TensorBoard scalars, written by process 0 only."""

from __future__ import annotations

import json
import math
import numbers
from pathlib import Path
from typing import Any, Mapping

import jax

from sera_jax.sampling.simulation import label as simulation_label


def _scalar(v: Any) -> float | None:
    if isinstance(v, bool):
        return float(v)
    if isinstance(v, numbers.Number):
        return float(v)
    try:
        arr = jax.device_get(v)
        return float(arr) if getattr(arr, "ndim", 1) == 0 else None
    except (TypeError, ValueError):
        return None


class MetricsWriter:
    """Appends ``{"version": v, "kind": ..., **values}`` lines to ``metrics.jsonl`` and scalars to TensorBoard."""

    def __init__(self, out_dir: str | Path, *, tensorboard: bool = True):
        self.enabled = jax.process_index() == 0
        self.path = Path(out_dir) / "metrics.jsonl"
        self._tb = None
        if not self.enabled:
            return
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._file = open(self.path, "a", buffering=1)
        if tensorboard:
            from tensorboardX import SummaryWriter

            self._tb = SummaryWriter(str(Path(out_dir) / "tensorboard"))

    def write(self, version: int, kind: str, values: Mapping[str, Any]) -> dict[str, Any]:
        """Writes one record; returns it as written (non-scalars kept in JSON, skipped in TensorBoard)."""
        # A run on a simulated device says so on every line (sampling/simulation.py).
        record: dict[str, Any] = {"version": int(version), "kind": kind, **simulation_label()}
        for k, v in values.items():
            s = _scalar(v)
            record[k] = v if s is None else (s if math.isfinite(s) else str(s))
        if self.enabled:
            self._file.write(json.dumps(record, default=str) + "\n")
            self._scalars(record)
        return record

    def _scalars(self, record: Mapping[str, Any]) -> None:
        if self._tb is not None:
            for k, v in record.items():
                if k not in ("version", "kind") and isinstance(v, float):
                    self._tb.add_scalar(f"{record['kind']}/{k}", v, int(record["version"]))

    def replay(self, records: list[Mapping[str, Any]]) -> None:
        """Writes already-recorded ``records`` (as ``read_metrics`` returns them) to TensorBoard only: rebuilds the
        events after a resume cut them (``training/resume.py``); returns None."""
        if self.enabled:
            for record in records:
                self._scalars(record)

    def close(self) -> None:
        if self.enabled:
            self._file.close()
            if self._tb is not None:
                self._tb.close()


def read_metrics(path: str | Path) -> list[dict[str, Any]]:
    """Returns the records of a ``metrics.jsonl`` file."""
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]
