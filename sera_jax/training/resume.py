"""A resumed run rewrites its history once: the records written after the restored checkpoint are cut back to it.

A run killed between two checkpoints (SIGKILL, a preemption without grace, a torn newest checkpoint) has written
metric lines, TensorBoard events and tree files for attempts its checkpoint does not hold. The resumed run redoes
those attempts; without the cut every redone version would appear twice (``metrics.jsonl`` versions ``[1, 1, 2,
3, 4]``, a tree file with both runs' trees).

What a checkpoint at (version N, skipped_steps S) holds is exactly N + S attempts: each attempt writes one ``step``
record (``Loop._record``) and one tree file ``trees/v{version:06d}_{skipped:04d}.jsonl`` named by the version it
attempted and the skipped count before it. So the cut keeps the first N + S step records (records of other kinds
stay) and the tree files whose (version, skipped) is below (N, S); a torn last line (a kill mid-write) goes too.
TensorBoard event files cannot be cut in place; when records were dropped the ``tensorboard/`` events are deleted
and the kept records replayed into a fresh file (``MetricsWriter.replay``), so every version appears once there
too (replayed events carry the replay's wall time).

Run by the process that writes the records (process 0), under the run lock, before the metrics writer opens.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path
from typing import Any, Sequence

from sera_jax.training import checkpoint_sizes

_TREE_FILE = re.compile(r"^v(\d+)_(\d+)(?:\.p\d+)?\.jsonl$")  # .p<i>: one process's part of a multi-host step


def _cut_metrics(path: Path, keep_steps: int) -> tuple[list[dict[str, Any]], int]:
    """Rewrites ``path`` with its first ``keep_steps`` step records; returns (kept records, lines dropped)."""
    if not path.is_file():
        return [], 0
    kept_lines, kept, dropped, steps = [], [], 0, 0
    for line in path.read_text().splitlines():
        if not line.strip():
            continue
        try:
            rec = json.loads(line)
        except ValueError:
            dropped += 1  # a line torn by a kill mid-write
            continue
        if rec.get("kind") == "step":
            if steps >= keep_steps:
                dropped += 1
                continue
            steps += 1
        kept_lines.append(line)
        kept.append(rec)
    if dropped:
        tmp = path.with_name(path.name + ".tmp")
        tmp.write_text("".join(x + "\n" for x in kept_lines))
        os.replace(tmp, path)  # atomic: a kill during the cut leaves the old file or the new one
    return kept, dropped


def _cut_trees(trees_dir: Path, version: int, skipped_steps: int) -> list[str]:
    """Deletes the tree files of attempts at or after (version, skipped_steps); returns their names."""
    if not trees_dir.is_dir():
        return []
    gone = []
    for f in sorted(trees_dir.iterdir()):
        m = _TREE_FILE.match(f.name)
        if m and (int(m.group(1)), int(m.group(2))) >= (version, skipped_steps):
            f.unlink()
            gone.append(f.name)
    return gone


def cut_back(out_dir: str | Path, version: int, skipped_steps: int) -> dict[str, Any]:
    """Cuts ``out_dir``'s records back to a checkpoint at (``version``, ``skipped_steps``) (0, 0 for a run with no
    checkpoint yet). Returns {"records": the kept metric records, "metric_lines_dropped": n, "tree_files_dropped":
    [names], "tensorboard_reset": whether the events were deleted (the caller replays "records" into them)}."""
    out = Path(out_dir)
    kept, dropped = _cut_metrics(out / "metrics.jsonl", version + skipped_steps)
    trees = _cut_trees(out / "trees", version, skipped_steps)
    tb = out / "tensorboard"
    reset = bool(dropped) and tb.is_dir()
    if reset:
        for f in tb.glob("events.out.tfevents.*"):
            f.unlink()
    return {"records": kept, "metric_lines_dropped": dropped, "tree_files_dropped": trees,
            "tensorboard_reset": reset}


def summary_line(cut: dict[str, Any]) -> str | None:
    """Returns one line saying what ``cut_back`` removed, or None when it removed nothing."""
    if not cut["metric_lines_dropped"] and not cut["tree_files_dropped"]:
        return None
    return (f"records cut back to the checkpoint: {cut['metric_lines_dropped']} metric lines and "
            f"{len(cut['tree_files_dropped'])} tree files of attempts being redone removed"
            + ("; TensorBoard events rewritten" if cut["tensorboard_reset"] else ""))


def finished(checkpointer: Any, total_steps: int) -> bool:
    """Returns whether the newest committed checkpoint of ``checkpointer`` (a ``Checkpointer``) is at or past
    ``total_steps`` (its rerun has nothing to train)."""
    latest = checkpointer.latest()
    return latest is not None and latest >= total_steps


def describe_start(cfg: Any, restored: bool, version: int) -> str:
    """Returns the line a training run starts with: where its parameters come from (``resuming from version N``,
    or version 0 from ``model.init_from``, ``model.hf_dir`` or a random initialisation)."""
    total = cfg.train.total_steps
    if restored:
        if version >= total:
            return f"already at version {version} of {total}"
        return f"resuming from version {version} (of {total})"
    m = cfg.model
    if m.init_from is not None:
        src = f"the newest checkpoint of {m.init_from} (model.init_from)"
    elif m.hf_dir is not None:
        src = f"the Hugging Face weights in {m.hf_dir}"
    else:
        src = f"a random initialisation (seed {cfg.train.seed})"
    return f"starting at version 0 of {total} from {src}"


def saved_version(out_dir: str | Path) -> int | None:
    """Returns the newest committed checkpoint version in a run directory (read from the directory names alone:
    orbax names a version being written ``N.orbax-checkpoint-tmp…`` until it commits), or None."""
    d = Path(out_dir) / "checkpoints"
    versions = [int(p.name) for p in d.iterdir() if p.is_dir() and p.name.isdigit()] if d.is_dir() else []
    return max(versions, default=None)


def finished_version(out_dir: str | Path, total_steps: int, *, needs: Sequence[str] = ()) -> int | None:
    """Returns the saved version of a finished run (one at or past ``total_steps`` whose run directory also holds
    every file of ``needs``, e.g. the default run's ``summary.json``), or None when there is something to do."""
    v = saved_version(out_dir)
    if v is None or v < total_steps or not all((Path(out_dir) / n).is_file() for n in needs):
        return None
    if not checkpoint_sizes.intact(Path(out_dir) / "checkpoints", v):
        return None  # torn since it was saved: the resume path reports it and falls back
    return v
