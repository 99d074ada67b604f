"""What pins an evaluation's output directory: the policy, the protocol and the task partition
(``evaluation/store.py`` compares them on every start, so that two different evaluations are never mixed in one
directory).

* The policy: an in-process one by the sha256 of its parameters (every leaf's bytes, in the tree's path order) with
  its architecture; a served one by its model name and its tokenizer's sha256 (and, for a ``sera-serve``, where its
  weights came from). The replicas' URLs are not pinned: a restarted server on another port may finish a pass.
* The protocol: everything that decides an outcome — the environment and its rules, the task set and difficulties,
  the agents' settings (temperature, steps, depth, prompt/context/completion caps), retries, runs, test-time
  selection, the seed. Concurrency, time-outs and the progress bar are not pinned: they change no outcome.
* The tasks: the ordered task ids' hash and the shard count.
"""

from __future__ import annotations

import dataclasses
import hashlib
from pathlib import Path
from typing import Any, Sequence

import jax
import numpy as np

from sera_jax.config import RunConfig


def params_digest(params: Any) -> str:
    """Returns the sha256 hex digest of a parameter tree: each leaf's path, dtype, shape and bytes, in path order."""
    h = hashlib.sha256()
    leaves = sorted(jax.tree_util.tree_flatten_with_path(params)[0], key=lambda kv: jax.tree_util.keystr(kv[0]))
    for path, leaf in leaves:
        a = np.asarray(jax.device_get(leaf))
        h.update(f"{jax.tree_util.keystr(path)}|{a.dtype}|{a.shape}|".encode())
        h.update(np.ascontiguousarray(a).tobytes())
    return h.hexdigest()


def file_digest(path: str | Path) -> str:
    """Returns the sha256 hex digest of a file (a directory: of its tokenizer files, in name order)."""
    p = Path(path)
    files = [p] if p.is_file() else sorted(f for f in p.iterdir() if f.is_file() and f.name.startswith("tokenizer"))
    h = hashlib.sha256()
    for f in files:
        h.update(f.name.encode() + b"\0" + f.read_bytes())
    return h.hexdigest()


def engine_identity(model_cfg: Any, params: Any, tokenizer_path: str) -> dict[str, Any]:
    """Returns the pinned identity of an in-process policy."""
    return {"kind": "engine", "params_sha256": params_digest(params),
            "model": {k: v for k, v in dataclasses.asdict(model_cfg).items() if isinstance(v, (int, float, str))},
            "tokenizer_sha256": file_digest(tokenizer_path)}


def served_identity(policy: Any) -> dict[str, Any]:
    """Returns the pinned identity of an ``EndpointPolicy``."""
    records = getattr(policy, "server_records", None) or [{}]
    sera = records[0].get("sera") if isinstance(records[0].get("sera"), dict) else {}
    path = getattr(policy.tokenizer, "path", None)
    return {"kind": "endpoint", "model": policy.model,
            "tokenizer_sha256": sera.get("tokenizer_sha256") or (file_digest(path) if path else None),
            **({"served_source": sera["source"]} if sera.get("source") else {})}


def protocol_identity(cfg: RunConfig, runs: int, settings: dict[str, Any]) -> dict[str, Any]:
    """Returns the pinned protocol: ``settings`` (the agents' runtime settings as a dict) and the eval fields that
    decide outcomes."""
    e = cfg.eval
    keep = ("task_set", "difficulties", "num_tasks", "temperature", "max_steps", "max_completion_tokens",
            "max_prompt_tokens", "context_tokens", "retries", "best_of_n", "fork_budget")
    pinned = {k: v for k, v in settings.items()
              if k not in ("cell_limits", "step_timeout_s", "tree_timeout_s", "sandbox_spares")}
    return {"env": cfg.env.name, "rules": cfg.env.rules, "method": cfg.method.name, "runs": int(runs),
            "seed": cfg.train.seed, "eval": {k: getattr(e, k) for k in keep}, "settings": pinned}


def tasks_identity(task_ids: Sequence[str], num_shards: int, partition_hash: str) -> dict[str, Any]:
    """Returns the pinned task partition."""
    return {"count": len(task_ids), "sha256": partition_hash, "num_shards": int(num_shards)}
