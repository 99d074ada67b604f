"""Per-turn PRNG keys derived from (seed, policy version, task, rollout index, node path, turn).

Strings are folded in through a stable 32-bit hash (blake2b, not Python's salted ``hash``), so the same tree on any
host, in any process, after any restart draws the same key for the same turn: a tree replays from its seed.
"""

from __future__ import annotations

import contextlib
import hashlib

import jax


def stable_hash(text: str) -> int:
    """Returns a stable unsigned 31-bit integer hash of ``text`` (fits ``fold_in``'s int32 data on every backend)."""
    return int.from_bytes(hashlib.blake2b(text.encode("utf-8"), digest_size=4).digest(), "little") & 0x7FFFFFFF


def _on_host():
    # Keys are made on the event loop for every turn: keep them on the host CPU so that no accelerator dispatch
    # (and no device sync) sits between agents; the engine reads the key words anyway.
    try:
        return jax.default_device(jax.local_devices(backend="cpu")[0])  # this process's (a multi-host job)
    except RuntimeError:
        return contextlib.nullcontext()


def tree_key(seed: int, policy_version: int, task_id: str, rollout_index: int) -> jax.Array:
    """Returns the root key of one tree: ``key(seed)`` folded with the version, the task id hash and the rollout."""
    with _on_host():
        k = jax.random.key(int(seed) & 0xFFFFFFFF)
        k = jax.random.fold_in(k, int(policy_version) & 0x7FFFFFFF)
        k = jax.random.fold_in(k, stable_hash(str(task_id)))
        return jax.random.fold_in(k, int(rollout_index) & 0x7FFFFFFF)


def turn_key(tree_root: jax.Array, node_path: str, turn: int) -> jax.Array:
    """Returns the key of one agent turn: the tree key folded with the node path hash and the turn index."""
    with _on_host():
        return jax.random.fold_in(jax.random.fold_in(tree_root, stable_hash(node_path)), int(turn))


def key_data(key: jax.Array) -> list[int]:
    """Returns the raw uint32 words of a key (for records and comparisons)."""
    return [int(x) for x in jax.random.key_data(key).ravel()]


def warm_keys() -> None:
    """Runs every key derivation of a turn once, so that their small programs are compiled before agents wait on
    them (a run's warm-up calls it: afterwards no turn traces or compiles anything)."""
    key_data(turn_key(tree_key(0, 0, "warm-up", 0), "root", 0))
    jax.random.key_data(jax.random.key(0))
