"""Named TextWorld-Sync task sets: the official files, the generator's folds, generated sets from another seed range,
and unions of them (what ``env.task_set`` / ``eval.task_set`` name).

A spec is one or more parts joined by ``+``; each part is

* a path to a manifest ``.json`` or a rows ``.jsonl`` file;
* ``sample``: the 40 official test records shipped with the package;
* a fold (``train``, ``test``, ``validation``; aliases ``dev``, ``val``, ``valid``), generated with its own seeds;
* ``<fold>@<base seed>``, optionally followed by ``?difficulties=a,b&families=x,y&per_cell=n``: the fold's layout
  generated from another base seed (seed formula of docs/design/textworld.md §2.5 with that base), e.g. ``test@900000?difficulties=easy
  &per_cell=16`` = 16 Easy tasks of every family with seeds 900000 + 100·family + offset. Such a set shares no seed
  with the fold's own tasks when the base seeds are far apart, so one can train on one range and hold another out.
  Its task ids carry the base seed (``…_test900000_<family>_<difficulty>_<offset>``), so they never collide with the
  fold's own ids or the official records'.

Task ids must be unique across the parts; ``load_task_set`` raises ValueError otherwise, or on a malformed spec.
"""

from __future__ import annotations

import re
from pathlib import Path
from urllib.parse import parse_qs

from envs_py.textworld_sync.bands import FAMILIES, FOLD_ALIASES, FOLDS, fold_layout
from envs_py.textworld_sync.generator import generate_tasks
from envs_py.textworld_sync.loader import SAMPLE_FILES, load_tasks
from envs_py.textworld_sync.tasks import DIFFICULTIES, TaskSpec, task_from_manifest_row

_SEEDED = re.compile(r"^(?P<fold>[a-z]+)@(?P<seed>\d+)(?:\?(?P<query>.*))?$")
_OPTIONS = ("difficulties", "families", "per_cell")
FILE_SUFFIXES = (".json", ".jsonl", ".json.gz", ".jsonl.gz")


def _seeded_options(query: str) -> dict:
    opts = parse_qs(query, keep_blank_values=True, strict_parsing=bool(query))
    unknown = sorted(set(opts) - set(_OPTIONS))
    if unknown:
        raise ValueError(f"unknown option(s) {unknown}; expected {list(_OPTIONS)}")
    out: dict = {}
    for key in ("difficulties", "families"):
        if key in opts:
            names = tuple(x for v in opts[key] for x in v.split(",") if x)
            known = DIFFICULTIES if key == "difficulties" else FAMILIES
            bad = [n for n in names if n not in known]
            if bad or not names:
                raise ValueError(f"{key}: expected names from {list(known)}, got {bad or names}")
            out[key] = names
    if "per_cell" in opts:
        value = opts["per_cell"][-1]
        if not value.isdigit() or int(value) < 1:
            raise ValueError(f"per_cell: expected a positive integer, got {value!r}")
        out["per_cell"] = int(value)
    return out


def _part(part: str) -> tuple[list[TaskSpec], list[str]]:
    if part in SAMPLE_FILES:
        return load_tasks(part), []
    if part in FOLDS or part in FOLD_ALIASES:
        return generate_tasks(part), []
    m = _SEEDED.match(part)
    if m:
        fold = m.group("fold")
        layout = fold_layout(fold)  # raises for an unknown fold
        base = int(m.group("seed"))
        opts = _seeded_options(m.group("query") or "")
        tasks = generate_tasks(fold, base_seed=base, **opts)
        ids = f"_{layout.id_name}_", f"_{layout.id_name}{base}_"
        return [task_from_manifest_row({**t.to_manifest_row(), "task_id": t.task_id.replace(*ids, 1)})
                for t in tasks], []
    if part.endswith(FILE_SUFFIXES):
        if not Path(part).is_file():
            raise ValueError(f"no task file {part}")
        return load_tasks(part), [part]
    raise ValueError(f"expected a file path, 'sample', a fold ({', '.join(sorted(FOLDS))}) or "
                     f"'<fold>@<base seed>[?difficulties=…&families=…&per_cell=n]', got {part!r}")


def load_task_set(spec: str) -> tuple[list[TaskSpec], list[str]]:
    """Returns (the tasks of ``spec`` in part order, the data files read) — see the module docstring."""
    tasks: list[TaskSpec] = []
    files: list[str] = []
    for part in spec.split("+"):
        try:
            got, read = _part(part.strip())
        except ValueError as e:
            raise ValueError(f"task set {spec!r}: {e}") from None
        tasks += got
        files += read
    seen: set[str] = set()
    dupes = sorted({t.task_id for t in tasks if t.task_id in seen or seen.add(t.task_id)})
    if dupes:
        raise ValueError(f"task set {spec!r}: duplicate task ids {dupes[:3]}")
    return tasks, files


def task_set_error(spec: str, check_paths: bool = False) -> str | None:
    """Returns why ``spec`` is not a task-set spec (None when it is), without generating anything; a file part is
    checked for existence only with ``check_paths``."""
    for part in (p.strip() for p in spec.split("+")):
        if part in SAMPLE_FILES or part in FOLDS or part in FOLD_ALIASES:
            continue
        m = _SEEDED.match(part)
        if m:
            if m.group("fold") not in FOLDS and m.group("fold") not in FOLD_ALIASES:
                return f"unknown fold {m.group('fold')!r} in {part!r}"
            try:
                _seeded_options(m.group("query") or "")
            except ValueError as e:
                return f"{part!r}: {e}"
            continue
        if part.endswith(FILE_SUFFIXES):
            if check_paths and not Path(part).is_file():
                return f"no task file {part}"
            continue
        return (f"expected a .json/.jsonl path, 'sample', a fold ({', '.join(sorted(FOLDS))}) or "
                f"'<fold>@<base seed>[?difficulties=…&families=…&per_cell=n]', got {part!r}")
    return None
