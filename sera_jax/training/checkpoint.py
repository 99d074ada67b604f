"""Orbax checkpoints of a training run: state (params, optimizer, step) + JSON metadata; keep-N; resume latest.

A checkpoint at policy version v holds everything the loop needs to continue exactly: the TrainState arrays
(restored directly into their shardings), and a JSON record with the version, the stage clock, the data order
and cursor, the PRNG key data, and run metadata (git SHA, config hash, library versions, sha256 of task files).
Saves are asynchronous (orbax); ``close()`` waits, so a run that exits normally or by exception loses nothing.
"""

from __future__ import annotations

import dataclasses
import hashlib
import importlib.metadata
import json
import platform
import subprocess
import time
from pathlib import Path
from typing import Any, Sequence

import jax
import numpy as np
import orbax.checkpoint as ocp

from sera_jax.config.errors import MissingPath
from sera_jax.model import Qwen3Config, abstract_params, param_shardings
from sera_jax.training import checkpoint_sizes
from sera_jax.training.step import TrainState

_LIBRARIES = ("jax", "jaxlib", "flax", "optax", "orbax-checkpoint", "numpy", "sera-jax")


def git_sha(repo_dir: str | Path | None = None) -> str:
    """Returns the HEAD commit of the source tree (with ``-dirty`` when it has local changes), or ``unknown``."""
    cwd = str(repo_dir or Path(__file__).resolve().parents[2])
    try:
        sha = subprocess.run(["git", "rev-parse", "HEAD"], cwd=cwd, capture_output=True, text=True, timeout=10,
                             check=True).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=cwd,
                               capture_output=True, text=True, timeout=10).stdout.strip()
        return sha + ("-dirty" if dirty else "")
    except (OSError, subprocess.SubprocessError):
        return "unknown"


def sha256_file(path: str | Path) -> str:
    """Returns the hex sha256 of a file's bytes."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def model_config_record(cfg: Qwen3Config) -> dict[str, Any]:
    """Returns the model config as stored in checkpoint metadata (``meta["model_config"]``)."""
    return dataclasses.asdict(cfg)


def make_meta(config: dict[str, Any], model_cfg, *, tokenizer_path: str | None,
              data_files: Sequence[str | Path] = ()) -> dict[str, Any]:
    """Returns the static part of the checkpoint record: model config, tokenizer path and provenance."""
    return {"model_config": model_config_record(model_cfg), "tokenizer_path": tokenizer_path,
            "run": run_metadata(config, list(data_files))}


def run_metadata(config: dict[str, Any], data_files: list[str | Path] = ()) -> dict[str, Any]:
    """Returns the provenance record stored with every checkpoint."""
    versions = {}
    for lib in _LIBRARIES:
        try:
            versions[lib] = importlib.metadata.version(lib)
        except importlib.metadata.PackageNotFoundError:
            versions[lib] = None
    canonical = json.dumps(config, sort_keys=True, separators=(",", ":"), default=str)
    return {
        "git_sha": git_sha(),
        "config_hash": hashlib.sha256(canonical.encode()).hexdigest(),
        "config": config,
        "libraries": versions,
        "python": platform.python_version(),
        "data_sha256": {str(p): sha256_file(p) for p in data_files},
        "devices": [str(d) for d in jax.devices()][:4] + ([f"... {jax.device_count()} total"]
                                                          if jax.device_count() > 4 else []),
        "process_count": jax.process_count(),
        "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }


def key_to_json(key: jax.Array) -> list[int]:
    """Returns a PRNG key as a JSON-able list (its raw uint32 data)."""
    return np.asarray(jax.random.key_data(key)).astype(np.uint32).tolist()


def key_from_json(data: list[int]) -> jax.Array:
    """Returns the PRNG key stored by ``key_to_json``."""
    return jax.random.wrap_key_data(np.asarray(data, np.uint32))


def _optimizer_part(state: TrainState) -> dict[str, Any]:
    return {"step": state.step, "opt_state": state.opt_state}


def checkpoint_dir(path: str | Path) -> Path:
    """Returns the checkpoints directory of ``path``: a run directory holds them under ``checkpoints/``, and a path
    that is already a checkpoints directory is returned as is. Raises FileNotFoundError when neither exists."""
    path = Path(path)
    d = path / "checkpoints" if (path / "checkpoints").is_dir() else path
    if not d.is_dir():
        raise MissingPath(f"no run or checkpoint directory {path}")
    return d


class Checkpointer:
    """Saves every ``every`` versions (and on demand), keeps the newest ``keep``, restores the latest."""

    def __init__(self, directory: str | Path, *, every: int = 50, keep: int = 3):
        if every <= 0 or keep <= 0:
            raise ValueError(f"checkpoint every/keep must be positive, got every={every} keep={keep}")
        self.directory = Path(directory).absolute()
        self.every = every
        self._saved = False  # a reader (sera-eval, sera-export) never writes into the run directory
        self.manager = ocp.CheckpointManager(
            self.directory, options=ocp.CheckpointManagerOptions(max_to_keep=keep, create=True))

    def due(self, version: int) -> bool:
        """Returns whether ``version`` falls on the save interval."""
        return version > 0 and version % self.every == 0

    def save(self, version: int, state: TrainState, meta: dict[str, Any], *, force: bool = False) -> bool:
        """Starts an asynchronous save of (state, meta) at ``version``; returns whether one was started."""
        if not (force or self.due(version)):
            return False
        if version in self.manager.all_steps():
            return False
        if jax.process_index() == 0:
            checkpoint_sizes.forget(self.directory, version)  # a redone version (a torn one dropped) is new files
        record = {**meta, "version": int(version)}
        # Parameters are their own item, so export and evaluation can restore them without the optimizer.
        self.manager.save(version, args=ocp.args.Composite(
            params=ocp.args.StandardSave(state.params), optimizer=ocp.args.StandardSave(_optimizer_part(state)),
            meta=ocp.args.JsonSave(record)), force=True)
        self._saved = True
        return True

    def latest(self) -> int | None:
        """Returns the newest saved version, or None."""
        return self.manager.latest_step()

    def restore(self, like: TrainState, version: int | None = None) -> tuple[TrainState, dict[str, Any]]:
        """Returns (state, meta) at ``version`` (default latest), with ``like``'s shapes, dtypes and shardings.

        ``like`` may hold arrays or ``jax.ShapeDtypeStruct``s (with ``.sharding`` for a sharded restore).
        """
        version = self.latest() if version is None else version
        if version is None:
            raise MissingPath(f"no checkpoint in {self.directory}")
        as_struct = lambda t: jax.tree.map(ocp.utils.to_shape_dtype_struct, t)
        out = self.manager.restore(version, args=ocp.args.Composite(
            params=ocp.args.StandardRestore(as_struct(like.params)),
            optimizer=ocp.args.StandardRestore(as_struct(_optimizer_part(like))), meta=ocp.args.JsonRestore()))
        opt = out.optimizer
        return TrainState(step=opt["step"], params=out.params, opt_state=opt["opt_state"]), dict(out.meta)

    def read_meta(self, version: int | None = None) -> dict[str, Any]:
        """Returns the JSON metadata of ``version`` (default latest) without reading any array."""
        version = self.latest() if version is None else version
        if version is None:
            raise MissingPath(f"no checkpoint in {self.directory}")
        return dict(self.manager.restore(version, args=ocp.args.Composite(meta=ocp.args.JsonRestore())).meta)

    def restore_params(self, like_params, version: int | None = None) -> tuple[Any, dict[str, Any]]:
        """Returns (params, meta) at ``version`` (default latest) without reading the optimizer state.

        Leaves of ``like_params`` with a sharding are restored into it; leaves without one onto this process's
        first device. Never the layout that was saved: a checkpoint written by another process count or device
        count names devices this process may not have."""
        version = self.latest() if version is None else version
        if version is None:
            raise MissingPath(f"no checkpoint in {self.directory}")
        here = jax.sharding.SingleDeviceSharding(jax.local_devices()[0])

        def target(x):
            sd = ocp.utils.to_shape_dtype_struct(x)
            return sd if getattr(sd, "sharding", None) is not None else jax.ShapeDtypeStruct(sd.shape, sd.dtype,
                                                                                             sharding=here)
        out = self.manager.restore(version, args=ocp.args.Composite(
            params=ocp.args.StandardRestore(jax.tree.map(target, like_params)), meta=ocp.args.JsonRestore()))
        return out.params, dict(out.meta)

    def restore_model(self, version: int | None = None, *, mesh=None):
        """Returns (Qwen3Config, params, meta) of ``version`` (default latest) from the model config recorded in
        the metadata, without reading the optimizer state: on ``mesh`` in the trainer's layout (a multi-host job:
        every process reads its own shards), else on this process's first device."""

        meta = self.read_meta(version)
        if "model_config" not in meta:
            raise ValueError(f"checkpoint {self.directory} version {meta.get('version')} has no model_config in "
                             "its metadata")
        cfg = Qwen3Config(**meta["model_config"])
        like = abstract_params(cfg)
        if mesh is not None:
            like = jax.tree.map(lambda a, sh: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=sh), like,
                                param_shardings(cfg, mesh))
        params, meta = self.restore_params(like, meta["version"])
        return cfg, params, meta

    def wait(self) -> None:
        """Blocks until pending saves are on disk (and records their file sizes, ``checkpoint_sizes``)."""
        self.manager.wait_until_finished()
        self._record_sizes()

    def close(self) -> None:
        """Waits for pending saves and releases the manager."""
        self.manager.wait_until_finished()
        self._record_sizes()
        self.manager.close()

    def _record_sizes(self) -> None:
        if self._saved and jax.process_index() == 0:  # one writer: every process sees the same committed files
            checkpoint_sizes.record(self.directory, self.manager.all_steps())
