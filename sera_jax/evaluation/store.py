"""An evaluation's output directory on disk: passes that survive a kill, and shards on separate machines (issue #54).

Layout of ``--out DIR`` (``N`` = ``num_shards``; with ``N == 1`` the shard directory is ``DIR`` itself)::

    DIR/identity.json                 the pinned identity, shared by all shards: the caller's dict + {"num_shards": N}
    DIR/shard-I-of-N/run.lock         the shard's one-writer lock (``training.run_lock``)
    DIR/shard-I-of-N/plan.json        the shard's tasks in order: [{"run", "task_id", "difficulty"}, ...]
    DIR/shard-I-of-N/trees.jsonl      every finished key's trees, one per line (``records.dumps_tree``)
    DIR/shard-I-of-N/results.jsonl    one record line per finished key: {"run", "task_id", "success", ...}
    DIR/trees.jsonl                   (N > 1) every shard's trees, concatenated by ``merge_trees`` for --aggregate

A key is ``(run index, task_id)``. ``EvalStore.append`` writes a key's trees first and its record line last, each as
one write of the whole block on an ``O_APPEND`` descriptor followed by ``fsync``; a key is finished once its record
line is on disk. A kill therefore leaves at most one torn line (in either file) and, before it, trees whose record
never came (orphans). ``EvalStore.open`` repairs both: the torn line is cut off, orphans and the trees and records
of errored keys (``success`` None: the protocol's own retries were spent) are dropped, and those keys are run again.

Completeness (``status``, ``collect``): a shard is complete when every key of its plan has a record line, an errored
one included (after its retries the protocol counts it as a failure); ``errored`` is still reported beside ``done``
(success True or False). A rerun of the same command over a complete shard still retries its errored keys.

Readers (``status``, ``collect``, ``merge_trees``) take no lock and tolerate a torn last line, so they are safe
while workers run. This module imports no JAX itself (``sera_jax.config.errors`` loads through the config package).
"""

from __future__ import annotations

import dataclasses
import fcntl
import hashlib
import json
import os
import socket
from pathlib import Path
from typing import Any, Callable, Iterator, Sequence, TypeVar

from sera_jax.agents.records import Tree, dumps_tree
from sera_jax.config.errors import UserError
from sera_jax.training.run_lock import LOCK_FILE, RunLock

__all__ = ["Key", "shard_tasks", "partition_hash", "shard_dir", "Resume", "EvalStore", "status", "format_status",
           "collect", "merge_trees", "IDENTITY_FILE", "PLAN_FILE", "RESULTS_FILE", "TREES_FILE"]

Key = tuple[int, str]  # (run index, task_id)
T = TypeVar("T")

IDENTITY_FILE = "identity.json"
PLAN_FILE = "plan.json"
RESULTS_FILE = "results.jsonl"
TREES_FILE = "trees.jsonl"
_ADVICE = "give another --out or rerun the same command"


# ------------------------------------------------------------------------------------------------- partition

def _check_shards(num_shards: int, shard_index: int) -> None:
    if isinstance(num_shards, bool) or not isinstance(num_shards, int) or num_shards < 1:
        raise UserError(f"--num-shards must be a whole number of at least 1, got {num_shards!r}")
    if isinstance(shard_index, bool) or not isinstance(shard_index, int) or not 0 <= shard_index < num_shards:
        raise UserError(f"--shard-index must be in [0, {num_shards}) for --num-shards {num_shards}, "
                        f"got {shard_index!r}")


def shard_tasks(tasks: Sequence[T], num_shards: int, shard_index: int) -> list[T]:
    """Returns shard ``shard_index``'s tasks: task i (in the given order) belongs to shard ``i % num_shards``.
    Raises UserError for ``num_shards < 1`` or ``shard_index`` outside ``[0, num_shards)``."""
    _check_shards(num_shards, shard_index)
    return list(tasks[shard_index::num_shards])


def partition_hash(task_ids: Sequence[str]) -> str:
    """Returns the sha256 hex digest of the ordered task ids joined by newlines."""
    return hashlib.sha256("\n".join(str(t) for t in task_ids).encode("utf-8")).hexdigest()


def shard_dir(out_dir: str | Path, num_shards: int, shard_index: int) -> Path:
    """Returns shard ``shard_index``'s directory: ``out_dir`` itself when ``num_shards == 1``, else
    ``out_dir / "shard-I-of-N"``. Raises UserError for a bad shard count or index."""
    _check_shards(num_shards, shard_index)
    out = Path(out_dir)
    return out if num_shards == 1 else out / f"shard-{shard_index}-of-{num_shards}"


# ------------------------------------------------------------------------------------------------ file helpers

def _fsync_dir(directory: Path) -> None:
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass  # some filesystems refuse fsync on a directory; the data files themselves were synced
    finally:
        os.close(fd)


def _write_all(fd: int, data: bytes) -> None:
    """Writes ``data`` to ``fd`` (continuing after a short write) and fsyncs it."""
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]
    os.fsync(fd)


def _atomic_write(path: Path, data: bytes) -> None:
    """Replaces ``path`` with ``data``: a temp file beside it, fsynced, then ``os.replace``."""
    tmp = path.with_name(f".{path.name}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        _write_all(fd, data)
    finally:
        os.close(fd)
    os.replace(tmp, path)
    _fsync_dir(path.parent)


def _create_exclusive(path: Path, data: bytes) -> bool:
    """Creates ``path`` holding ``data`` unless it exists, atomically (a temp file hard-linked into place, so no
    reader ever sees it half written; ``O_EXCL`` where links are refused); returns whether this call created it."""
    tmp = path.with_name(f".{path.name}.{socket.gethostname()}.{os.getpid()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        _write_all(fd, data)
    finally:
        os.close(fd)
    try:
        os.link(tmp, path)
        created = True
    except FileExistsError:
        created = False
    except OSError:  # a filesystem without hard links
        try:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        except FileExistsError:
            created = False
        else:
            try:
                _write_all(fd, data)
            finally:
                os.close(fd)
            created = True
    finally:
        tmp.unlink(missing_ok=True)
    _fsync_dir(path.parent)
    return created


def _norm(value: Any) -> Any:
    """Returns ``value`` as JSON reads it back (tuples become lists, keys strings)."""
    return json.loads(json.dumps(value))


def _read_json(path: Path) -> Any:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except ValueError as e:
        raise UserError(f"{path} is not JSON ({e}): restore it, or give another --out") from None


@dataclasses.dataclass
class _Line:
    start: int          # byte offset of the line
    end: int            # byte offset just past its newline
    obj: Any            # the parsed JSON value, or None for a blank line


def _scan(path: Path, *, strict: bool) -> tuple[list[_Line], bool, int]:
    """Returns (the complete lines of a JSONL file, whether it ended in a torn line, its size). A torn line is a
    last line without its newline, or a last line that is not a JSON object: a kill mid-write. A line that is not
    a JSON object anywhere else raises UserError when ``strict`` and is passed over otherwise."""
    lines: list[_Line] = []
    if not path.exists():
        return lines, False, 0
    bad: tuple[int, int, str] | None = None  # (line number, offset, why) of a bad line, torn if nothing follows it
    offset = 0
    with open(path, "rb") as fh:
        for number, raw in enumerate(fh, 1):
            start, offset = offset, offset + len(raw)
            if bad is not None:
                if strict:
                    raise UserError(f"{path} line {bad[0]} is not a JSON record ({bad[2]}): the file was edited or "
                                    "damaged; restore it, or give another --out")
                bad = None
            if not raw.endswith(b"\n"):
                bad = (number, start, "no newline")
                continue
            if not raw.strip():
                lines.append(_Line(start, offset, None))
                continue
            try:
                obj = json.loads(raw)
            except ValueError as e:
                bad = (number, start, str(e))
                continue
            if not isinstance(obj, dict):
                bad = (number, start, f"a JSON {type(obj).__name__}")
                continue
            lines.append(_Line(start, offset, obj))
    return lines, bad is not None, offset


def _keep(path: Path, lines: list[_Line], keep: list[bool], size: int) -> None:
    """Leaves only the kept lines in ``path``: cut back when they are a prefix of the file, else rewritten (a temp
    file, fsynced, then ``os.replace``). A kill during either leaves the old file or the new one."""
    kept = [line for line, k in zip(lines, keep) if k]
    prefix_end = 0
    for line in kept:
        if line.start != prefix_end:
            break
        prefix_end = line.end
    else:
        if prefix_end < size:
            fd = os.open(path, os.O_WRONLY)
            try:
                os.ftruncate(fd, prefix_end)
                os.fsync(fd)
            finally:
                os.close(fd)
        return
    tmp = path.with_name(f".{path.name}.rewrite")
    with open(path, "rb") as src, open(tmp, "wb") as dst:
        for line in kept:
            src.seek(line.start)
            dst.write(src.read(line.end - line.start))
        dst.flush()
        os.fsync(dst.fileno())
    os.replace(tmp, path)
    _fsync_dir(path.parent)


def _record_key(obj: dict) -> Key | None:
    run, task_id = obj.get("run"), obj.get("task_id")
    if isinstance(run, bool) or not isinstance(run, int) or task_id is None:
        return None
    return run, str(task_id)


def _tree_key(obj: dict) -> Key | None:
    misc = obj.get("misc")
    ev = misc.get("eval") if isinstance(misc, dict) else None
    run = ev.get("run") if isinstance(ev, dict) else None
    if isinstance(run, bool) or not isinstance(run, int) or obj.get("task_id") is None:
        return None
    return run, str(obj["task_id"])


def _last_records(lines: list[_Line]) -> dict[Key, tuple[int, dict]]:
    """Returns each key's last record line (its index in ``lines``, the record), in first-appearance order."""
    last: dict[Key, tuple[int, dict]] = {}
    for i, line in enumerate(lines):
        key = None if line.obj is None else _record_key(line.obj)
        if key is not None:
            last[key] = (i, line.obj)
    return last


def _plan_rows(plan: Sequence[tuple[Key, str]]) -> list[dict]:
    rows = []
    for (run, task_id), difficulty in plan:
        rows.append({"run": int(run), "task_id": str(task_id), "difficulty": str(difficulty)})
    return rows


def _flatten(value: Any, prefix: str = "") -> dict[str, Any]:
    if isinstance(value, dict) and (value or not prefix):
        out: dict[str, Any] = {}
        for k, v in value.items():
            out.update(_flatten(v, f"{prefix}{k}."))
        return out
    return {prefix[:-1]: value}


def _show(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


def _identity_difference(where: Path, pinned: dict, mine: dict) -> str | None:
    """Returns the one-line refusal naming up to 3 dotted keys whose values differ, or None when none does."""
    old, new = _flatten(pinned), _flatten(mine)
    names = [k for k in new if old.get(k, _MISSING) != new[k]]
    names += [k for k in old if k not in new]
    if not names:
        return None
    was = ", ".join(f"{k}={_show(old[k])}" if k in old else f"no {k}" for k in names[:3])
    has = ", ".join(f"{k}={_show(new[k])}" if k in new else f"no {k}" for k in names[:3])
    more = f" (and {len(names) - 3} more)" if len(names) > 3 else ""
    return f"{where} was evaluated with {was}; this command has {has}{more}: {_ADVICE}"


_MISSING = object()


def _plan_difference(path: Path, stored: list, mine: list[dict]) -> str | None:
    def show(row: Any) -> str:
        if isinstance(row, dict):
            return f"run {row.get('run')} task {row.get('task_id')!r} ({row.get('difficulty')})"
        return repr(row)
    for i, (a, b) in enumerate(zip(stored, mine)):
        if a != b:
            return (f"{path} holds another plan: its entry {i} is {show(a)}, this command's is {show(b)}: {_ADVICE}")
    if len(stored) != len(mine):
        return f"{path} holds another plan: {len(stored)} tasks where this command plans {len(mine)}: {_ADVICE}"
    return None


# ---------------------------------------------------------------------------------------------------- writer

@dataclasses.dataclass
class Resume:
    """What ``EvalStore.open`` found of earlier sessions."""

    done: dict[Key, dict]   # finished records kept from earlier sessions (success True/False)
    retry: int              # keys whose stored record had success None (errored): records and trees dropped
    dropped_trees: int      # tree lines removed: orphans of unfinished keys, errored keys' trees, a torn last line
    torn: bool              # the files ended in a partial line (a kill mid-write) that was cut off


class EvalStore:
    """One shard's writer: ``open`` (lock, identity, plan, repair) → ``append`` per finished key → ``close``."""

    def __init__(self, out_dir: str | Path, *, num_shards: int = 1, shard_index: int = 0,
                 warn: Callable[[str], None] | None = None):
        self.out_dir = Path(out_dir)
        self.num_shards = num_shards
        self.shard_index = shard_index
        self.directory = shard_dir(out_dir, num_shards, shard_index)
        self._lock = RunLock(self.directory, warn=warn)
        self._locked = False
        self._plan: dict[Key, str] | None = None
        self._records: dict[Key, dict] = {}
        self._fds: dict[str, int] = {}

    # -- open

    def open(self, identity: dict, plan: Sequence[tuple[Key, str]]) -> Resume:
        """Takes the shard's lock, pins ``identity`` (out_dir/identity.json), writes or checks the shard's
        ``plan`` ((key, difficulty) in order) and repairs what a kill left; returns the ``Resume``.

        Raises ``RunLocked`` when a live process writes this shard (a dead one's stale lock is taken over with a
        warning), and ``UserError`` (one line) when the pinned identity or plan differs."""
        if self._plan is not None:
            raise RuntimeError(f"the store of {self.directory} is already open")
        rows = _plan_rows(plan)
        keys = [(r["run"], r["task_id"]) for r in rows]
        if len(set(keys)) != len(keys):
            raise ValueError("the plan names a (run, task_id) twice")
        self._lock.acquire()
        self._locked = True
        try:
            self._pin_identity(identity)
            plan_path = self.directory / PLAN_FILE
            if plan_path.exists():
                why = _plan_difference(plan_path, _read_json(plan_path), rows)
                if why:
                    raise UserError(why)
            else:
                _atomic_write(plan_path, (json.dumps(rows, indent=0) + "\n").encode("utf-8"))
            self._plan = {(r["run"], r["task_id"]): r["difficulty"] for r in rows}
            resume = self._repair()
            for name in (TREES_FILE, RESULTS_FILE):
                path = self.directory / name
                created = not path.exists()
                self._fds[name] = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
                if created:
                    _fsync_dir(self.directory)
        except BaseException:
            self._plan = None
            self.close()
            raise
        self._records = dict(resume.done)
        return resume

    def _pin_identity(self, identity: dict) -> None:
        mine = {**_norm(dict(identity)), "num_shards": self.num_shards}
        path = self.out_dir / IDENTITY_FILE
        if not path.exists() and _create_exclusive(path, (json.dumps(mine, indent=2) + "\n").encode("utf-8")):
            return
        pinned = _read_json(path)
        if not isinstance(pinned, dict):
            raise UserError(f"{path} does not hold an evaluation's identity: restore it, or give another --out")
        why = _identity_difference(self.out_dir, pinned, mine)
        if why:
            raise UserError(why)

    def _repair(self) -> Resume:
        assert self._plan is not None
        res_path, tree_path = self.directory / RESULTS_FILE, self.directory / TREES_FILE
        res_lines, res_torn, res_size = _scan(res_path, strict=True)
        tree_lines, tree_torn, tree_size = _scan(tree_path, strict=True)
        last = _last_records(res_lines)
        for i, line in enumerate(res_lines):
            if line.obj is None:
                continue
            key = _record_key(line.obj)
            if key is None or key not in self._plan:
                raise UserError(f"{res_path} line {i + 1} records {line.obj.get('run')!r}/"
                                f"{line.obj.get('task_id')!r}, which is not in this shard's plan: the file was "
                                "edited or belongs elsewhere; restore it, or give another --out")
            if line.obj.get("success", _MISSING) not in (True, False, None):
                raise UserError(f"{res_path} line {i + 1} has no success true/false/null: the file was edited or "
                                "damaged; restore it, or give another --out")
        done = {k: rec for k, (_, rec) in last.items() if rec["success"] is not None}
        retry = sum(1 for _, rec in last.values() if rec["success"] is None)
        done_lines = {i for k, (i, _) in last.items() if k in done}
        res_keep = [i in done_lines for i in range(len(res_lines))]
        tree_keep = [line.obj is not None and _tree_key(line.obj) in done for line in tree_lines]
        dropped = sum(1 for line, k in zip(tree_lines, tree_keep) if not k and line.obj is not None) + tree_torn
        # trees first: a kill between the two rewrites leaves records whose trees are gone only for keys that are
        # then retried anyway (errored), or trees without records (orphans), which the next open drops
        if not all(tree_keep) or tree_torn:
            _keep(tree_path, tree_lines, tree_keep, tree_size)
        if not all(res_keep) or res_torn:
            _keep(res_path, res_lines, res_keep, res_size)
        return Resume(done=done, retry=retry, dropped_trees=dropped, torn=res_torn or tree_torn)

    # -- write

    def append(self, key: Key, record: dict, trees: Sequence[Tree]) -> None:
        """Appends ``key``'s trees to trees.jsonl, then its record line ``{"run", "task_id", **record}`` to
        results.jsonl, each as one write of the whole block followed by fsync; the key counts as finished once the
        record line is written. ``record`` holds ``success`` (True/False/None) and whatever else the caller keeps
        (difficulty, attempts, errors, stats, game). Each tree must carry ``misc["eval"]["run"] == key[0]`` and
        ``task_id == key[1]`` (else ``open`` would drop it as foreign); a key is recorded once per session.

        A write that fails (a full disk) is cut back from both files before the error propagates."""
        if self._plan is None:
            raise RuntimeError(f"the store of {self.directory} is not open")
        run, task_id = int(key[0]), str(key[1])
        key = (run, task_id)
        if key not in self._plan:
            raise ValueError(f"run {run} task {task_id!r} is not in this shard's plan")
        if key in self._records:
            raise ValueError(f"run {run} task {task_id!r} is already recorded in {self.directory}")
        if record.get("success", _MISSING) not in (True, False, None):
            raise ValueError(f"the record of run {run} task {task_id!r} needs success True, False or None")
        if ("run" in record and record["run"] != run) or ("task_id" in record and str(record["task_id"]) != task_id):
            raise ValueError(f"the record of run {run} task {task_id!r} names run {record.get('run')!r} task "
                             f"{record.get('task_id')!r}")
        for tree in trees:
            ev = tree.misc.get("eval")
            if str(tree.task_id) != task_id or not isinstance(ev, dict) or ev.get("run") != run:
                raise ValueError(f"tree {tree.id} (task {tree.task_id!r}, misc.eval {ev!r}) is not run {run} of "
                                 f"task {task_id!r}")
        rest = {k: v for k, v in record.items() if k not in ("run", "task_id")}
        line = json.dumps({"run": run, "task_id": task_id, **rest}, ensure_ascii=False) + "\n"
        block = "".join(dumps_tree(t) + "\n" for t in trees).encode("utf-8")
        tree_fd, res_fd = self._fds[TREES_FILE], self._fds[RESULTS_FILE]
        sizes = os.fstat(tree_fd).st_size, os.fstat(res_fd).st_size
        try:
            if block:
                _write_all(tree_fd, block)
            _write_all(res_fd, line.encode("utf-8"))
        except BaseException:
            for fd, size in zip((tree_fd, res_fd), sizes):
                try:
                    os.ftruncate(fd, size)
                except OSError:
                    pass  # left torn: the next open cuts it off
            raise
        self._records[key] = json.loads(line)

    def records(self) -> dict[Key, dict]:
        """Returns this shard's records by key: those kept by ``open`` and those appended since."""
        return dict(self._records)

    def close(self) -> None:
        """Closes the files and releases the lock (idempotent)."""
        for fd in self._fds.values():
            os.close(fd)
        self._fds.clear()
        self._plan = None
        if self._locked:
            self._locked = False
            self._lock.release()

    def __enter__(self) -> "EvalStore":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


# --------------------------------------------------------------------------------------------------- readers

def _identity(out_dir: Path) -> dict:
    path = out_dir / IDENTITY_FILE
    if not path.is_file():
        raise UserError(f"{out_dir} holds no evaluation (no {IDENTITY_FILE}): give the --out of a sera-eval run")
    pinned = _read_json(path)
    if not isinstance(pinned, dict) or not isinstance(pinned.get("num_shards"), int) or pinned["num_shards"] < 1:
        raise UserError(f"{path} does not hold an evaluation's identity: restore it, or give another --out")
    return pinned


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _holder(directory: Path) -> dict | None:
    """Returns the lock record of the process that holds ``directory``'s lock now, or None. Takes no lock from a
    live writer: an empty record or a dead pid on this host decide without a lock; otherwise a non-blocking shared
    flock on a separate descriptor, dropped at once, tells whether the recorded holder still holds it."""
    try:
        fd = os.open(directory / LOCK_FILE, os.O_RDONLY)
    except OSError:
        return None
    try:
        raw = os.read(fd, 1 << 16)
        if not raw.strip():
            return None
        try:
            holder = json.loads(raw)
        except ValueError:
            holder = None
        if not isinstance(holder, dict):
            holder = {}
        pid, same_host = holder.get("pid"), holder.get("host") == socket.gethostname()
        if same_host and isinstance(pid, int) and not _alive(pid):
            return None
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:
            return holder
        except OSError:  # a filesystem without flock: trust the record
            return holder
        fcntl.flock(fd, fcntl.LOCK_UN)
        return None
    finally:
        os.close(fd)


def _shard_state(directory: Path) -> tuple[dict, list[dict] | None, dict[Key, dict]]:
    """Returns (the shard's status entry less its index, its plan rows or None, each plan key's last record)."""
    plan_path = directory / PLAN_FILE
    rows: list[dict] | None = None
    if plan_path.is_file():
        try:
            loaded = json.loads(plan_path.read_text(encoding="utf-8"))
        except ValueError:
            loaded = None
        rows = loaded if isinstance(loaded, list) else None
    last: dict[Key, dict] = {}
    by_difficulty: dict[str, dict[str, int]] = {}
    if rows is not None:
        lines, _, _ = _scan(directory / RESULTS_FILE, strict=False)
        every = {k: rec for k, (_, rec) in _last_records(lines).items()}
        for row in rows:
            key = (row["run"], str(row["task_id"]))
            counts = by_difficulty.setdefault(str(row.get("difficulty", "")), {"done": 0, "errored": 0, "total": 0})
            counts["total"] += 1
            if key in every:
                last[key] = every[key]
                counts["done" if every[key].get("success") is not None else "errored"] += 1
    done = sum(c["done"] for c in by_difficulty.values())
    errored = sum(c["errored"] for c in by_difficulty.values())
    total = sum(c["total"] for c in by_difficulty.values())
    holder = _holder(directory)
    entry = {"directory": str(directory), "started": rows is not None, "locked": holder is not None,
             "holder": holder, "by_difficulty": by_difficulty, "done": done, "errored": errored, "total": total,
             "complete": rows is not None and done + errored == total}
    return entry, rows, last


def status(out_dir: str | Path) -> dict:
    """Returns the evaluation's progress, read without a lock (safe while workers run): ``{"num_shards", "shards":
    [{"index", "directory", "started" (its plan is written), "locked" (a live process holds its lock now),
    "holder" (that process's lock record, or None), "by_difficulty": {d: {"done", "errored", "total"}}, "done",
    "errored", "total", "complete"}], "by_difficulty" (summed over the shards), "done", "errored", "total",
    "complete"}``. ``done`` counts keys whose last record has success True/False, ``errored`` those whose last record
    has None; a shard is complete when every key of its plan has a record (errored ones included). Totals count the
    started shards only (a shard's plan is written when it starts). Raises UserError when out_dir holds no
    identity.json."""
    out = Path(out_dir)
    n = _identity(out)["num_shards"]
    shards = []
    totals: dict[str, dict[str, int]] = {}
    for i in range(n):
        entry, _, _ = _shard_state(shard_dir(out, n, i))
        shards.append({"index": i, **entry})
        for d, c in entry["by_difficulty"].items():
            t = totals.setdefault(d, {"done": 0, "errored": 0, "total": 0})
            for k in t:
                t[k] += c[k]
    return {"num_shards": n, "shards": shards, "by_difficulty": totals,
            "done": sum(s["done"] for s in shards), "errored": sum(s["errored"] for s in shards),
            "total": sum(s["total"] for s in shards), "complete": all(s["complete"] for s in shards)}


def _counts(by_difficulty: dict[str, dict[str, int]]) -> str:
    parts = []
    items = list(by_difficulty.items())
    if len(items) > 1:
        items.append(("all", {k: sum(c[k] for c in by_difficulty.values()) for k in ("done", "errored", "total")}))
    for d, c in items:
        text = f"{d or 'tasks'} {c['done']}/{c['total']}"
        if c["errored"]:
            text += f" ({c['errored']} errored)"
        parts.append(text)
    return ", ".join(parts) if parts else "no tasks"


def _state(shard: dict) -> str:
    if shard["complete"]:
        return "complete"
    if shard["locked"]:
        h = shard.get("holder") or {}
        return f"running (pid {h.get('pid', '?')} on {h.get('host', '?')})"
    return "stopped" if shard["started"] else "missing"


def format_status(st: dict) -> str:
    """Returns the lines ``sera-eval --status DIR`` prints: one per shard, ``shard 0 of 2 (DIR/shard-0-of-2):
    running (pid 7 on h): easy 12/20 (1 errored), hard 0/8, all 12/28 (1 errored)``, and with several shards a total
    line ``all shards: incomplete (1 running, 1 missing): ...``. A shard is ``complete``, ``running`` (a live
    process holds its lock), ``stopped`` (started, incomplete, nobody writing it: rerun the command) or ``missing``
    (not started). ``done/total`` counts keys with success True/False; errored keys are shown beside it."""
    n = st["num_shards"]
    lines = []
    for s in st["shards"]:
        name = s["directory"] if n == 1 else f"shard {s['index']} of {n} ({s['directory']})"
        counts = f": {_counts(s['by_difficulty'])}" if s["started"] else ""
        lines.append(f"{name}: {_state(s)}{counts}")
    if n > 1:
        if st["complete"]:
            state = "complete"
        else:
            tally: dict[str, int] = {}
            for s in st["shards"]:
                word = _state(s).split(" ")[0]
                tally[word] = tally.get(word, 0) + 1
            state = "incomplete (" + ", ".join(f"{c} {w}" for w, c in tally.items()) + ")"
        lines.append(f"all shards: {state}: {_counts(st['by_difficulty'])}")
    return "\n".join(lines)


def collect(out_dir: str | Path) -> tuple[dict, list[dict[Key, dict]]]:
    """Returns (the pinned identity as identity.json holds it, ``num_shards`` included; each shard's last record
    per plan key, in plan order, shards in order) for ``--aggregate``. Raises UserError with one line naming every
    shard that has not started or is incomplete, and when two shards' plans share a key."""
    out = Path(out_dir)
    identity = _identity(out)
    n = identity["num_shards"]
    problems, per_shard, seen = [], [], {}
    for i in range(n):
        directory = shard_dir(out, n, i)
        entry, rows, last = _shard_state(directory)
        name = "the evaluation" if n == 1 else f"shard {i} of {n}"
        if not entry["started"]:
            problems.append(f"{name} ({directory}) has not started")
        elif not entry["complete"]:
            errored = f", {entry['errored']} errored" if entry["errored"] else ""
            state = " (running now)" if entry["locked"] else ""
            problems.append(f"{name} ({directory}) is incomplete{state}: {entry['done']} of {entry['total']} "
                            f"tasks done{errored}")
        else:
            for row in rows or []:
                key = (row["run"], str(row["task_id"]))
                if key in seen:
                    raise UserError(f"shards {seen[key]} and {i} of {out} both plan run {key[0]} task {key[1]!r}: "
                                    "they were not cut from one partition; rerun them into another --out")
                seen[key] = i
            per_shard.append({(row["run"], str(row["task_id"])): last[(row["run"], str(row["task_id"]))]
                              for row in rows or []})
    if problems:
        raise UserError("; ".join(problems) + (": run those shards (the same command with their --shard-index), "
                                               "then aggregate again" if n > 1 else ": rerun the same command"))
    return identity, per_shard


def _chunks(path: Path) -> Iterator[bytes]:
    """Yields ``path``'s bytes up to its last newline (a torn last line is left out)."""
    if not path.is_file():
        return
    size = path.stat().st_size
    with open(path, "rb") as fh:
        if size:
            fh.seek(size - 1)
            if fh.read(1) != b"\n":  # torn: find the last newline
                pos, step = size, 1 << 16
                end = 0
                while pos > 0:
                    lo = max(0, pos - step)
                    fh.seek(lo)
                    buf = fh.read(pos - lo)
                    j = buf.rfind(b"\n")
                    if j >= 0:
                        end = lo + j + 1
                        break
                    pos = lo
                size = end
        fh.seek(0)
        left = size
        while left:
            buf = fh.read(min(left, 1 << 20))
            if not buf:
                break
            left -= len(buf)
            yield buf


def merge_trees(out_dir: str | Path) -> Path:
    """Returns the evaluation's one trees file: with several shards, every shard's trees.jsonl concatenated in
    shard order into ``out_dir/trees.jsonl`` (a torn last line left out; written to a temp file, then
    ``os.replace``); with one shard, ``out_dir/trees.jsonl`` as it is. Raises UserError when out_dir holds no
    identity.json."""
    out = Path(out_dir)
    n = _identity(out)["num_shards"]
    dest = out / TREES_FILE
    if n == 1:
        return dest
    tmp = out / f".{TREES_FILE}.merge"
    with open(tmp, "wb") as dst:
        for i in range(n):
            for chunk in _chunks(shard_dir(out, n, i) / TREES_FILE):
                dst.write(chunk)
        dst.flush()
        os.fsync(dst.fileno())
    os.replace(tmp, dest)
    _fsync_dir(out)
    return dest

