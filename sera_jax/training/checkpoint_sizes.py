"""The size of every file of a committed checkpoint, recorded once the save is on disk and checked without JAX.

A rerun of a finished run decides "nothing to do" from the directory names alone, before JAX starts; a newest
checkpoint truncated afterwards (a full disk, a copy cut short) would then go unnoticed until someone reads it. Each
committed version's file sizes are kept in ``checkpoints/.sizes/<version>.json`` (orbax lists only numbered
directories), so that check can see a torn file and hand the run to the resume path, which reports it and falls
back to the newest intact version (``training.intact``). Sizes catch truncation and missing files, not flipped bits.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Iterable

SIZES_DIR = ".sizes"


def _files(step: Path) -> dict[str, int]:
    return {str(f.relative_to(step)): f.stat().st_size for f in sorted(step.rglob("*")) if f.is_file()}


def record(directory: str | Path, versions: Iterable[int]) -> None:
    """Writes the sizes of each committed ``version`` under ``directory`` (a checkpoints folder) that has none yet,
    and drops those of versions no longer kept; returns None. Call it once the saves are on disk."""
    directory = Path(directory)
    keep = {int(v) for v in versions}
    dest = directory / SIZES_DIR
    dest.mkdir(exist_ok=True)
    for v in keep:
        path = dest / f"{v}.json"
        if path.exists() or not (directory / str(v)).is_dir():
            continue
        tmp = path.with_suffix(f".tmp{os.getpid()}")
        tmp.write_text(json.dumps(_files(directory / str(v))))
        os.replace(tmp, path)  # a reader never sees half a record
    for path in dest.glob("*.json"):
        if path.stem.isdigit() and int(path.stem) not in keep:
            path.unlink(missing_ok=True)


def forget(directory: str | Path, version: int) -> None:
    """Drops the record of ``version`` (about to be written again); returns None."""
    (Path(directory) / SIZES_DIR / f"{int(version)}.json").unlink(missing_ok=True)


def intact(directory: str | Path, version: int) -> bool:
    """Returns False when a file of ``version`` recorded by ``record`` is missing or has another size; True
    otherwise (also when no record exists: a run written before these records, or one killed before its save was
    recorded, is left to a real read)."""
    directory = Path(directory)
    path = directory / SIZES_DIR / f"{version}.json"
    if not path.is_file():
        return True
    try:
        sizes = json.loads(path.read_text())
    except (OSError, ValueError):
        return True
    step = directory / str(version)
    return all((step / rel).is_file() and (step / rel).stat().st_size == n for rel, n in sizes.items())
