"""Per-turn PRNG keys derived from (seed, policy version, task, rollout index, node path, turn).

Strings are folded in through a stable 32-bit hash (blake2b, not Python's salted ``hash``), so the same tree on any
host, in any process, after any restart draws the same key for the same turn: a tree replays from its seed.
"""

from __future__ import annotations

import hashlib

import jax
import numpy as np


def stable_hash(text: str) -> int:
    """Returns a stable unsigned 31-bit integer hash of ``text`` (fits ``fold_in``'s int32 data on every backend)."""
    return int.from_bytes(hashlib.blake2b(text.encode("utf-8"), digest_size=4).digest(), "little") & 0x7FFFFFFF


_M32 = 0xFFFFFFFF
_ROTATIONS = ((13, 15, 26, 6), (17, 29, 16, 24))


def _threefry2x32(k0: int, k1: int, x0: int, x1: int) -> tuple[int, int]:
    """Threefry-2x32 (20 rounds) of one block, in plain integers: what ``jax.random``'s default PRNG computes."""
    ks = (k0, k1, k0 ^ k1 ^ 0x1BD11BDA)
    x0, x1 = (x0 + k0) & _M32, (x1 + k1) & _M32
    for i in range(5):
        for r in _ROTATIONS[i % 2]:
            x0 = (x0 + x1) & _M32
            x1 = (((x1 << r) | (x1 >> (32 - r))) & _M32) ^ x0
        x0, x1 = (x0 + ks[(i + 1) % 3]) & _M32, (x1 + ks[(i + 2) % 3] + i + 1) & _M32
    return x0, x1


def _fold_in(words: tuple[int, int], data: int) -> tuple[int, int]:
    """``jax.random.fold_in`` on raw threefry key words (data < 2³²: its seed block is [0, data])."""
    return _threefry2x32(words[0], words[1], 0, data & _M32)


def _wrap(words: tuple[int, int]) -> jax.Array:
    # Keys are made on the event loop for every turn. Derived here in integers (bit-identical to jax.random's
    # fold_in, tests/agents/test_truncation_keys.py) they cost one small host-CPU copy instead of a dozen eager
    # JAX dispatches (~240 µs a turn alone, over 1 ms on a busy host: issue #57); kept on the host CPU so that no
    # accelerator dispatch sits between agents (the engine reads the words anyway).
    # The key carries its words (``host_words``): the next fold and the engine read them without a device op.
    data = np.asarray(words, np.uint32)
    try:
        with jax.default_device(jax.local_devices(backend="cpu")[0]):  # this process's (a multi-host job)
            key = jax.random.wrap_key_data(data)
    except RuntimeError:
        key = jax.random.wrap_key_data(data)
    key.host_words = words
    return key


def _words(key: jax.Array) -> tuple[int, int]:
    words = getattr(key, "host_words", None)
    return words if words is not None else tuple(int(x) for x in np.asarray(jax.random.key_data(key)).ravel())


def tree_key(seed: int, policy_version: int, task_id: str, rollout_index: int) -> jax.Array:
    """Returns the root key of one tree: ``key(seed)`` folded with the version, the task id hash and the rollout."""
    words = (0, int(seed) & _M32)  # jax.random.key(seed) for a 32-bit seed
    for data in (int(policy_version) & 0x7FFFFFFF, stable_hash(str(task_id)), int(rollout_index) & 0x7FFFFFFF):
        words = _fold_in(words, data)
    return _wrap(words)


def turn_key(tree_root: jax.Array, node_path: str, turn: int) -> jax.Array:
    """Returns the key of one agent turn: the tree key folded with the node path hash and the turn index."""
    root = _words(tree_root)
    return _wrap(_fold_in(_fold_in(root, stable_hash(node_path)), int(turn) & _M32))


def key_data(key: jax.Array) -> list[int]:
    """Returns the raw uint32 words of a key (for records and comparisons)."""
    return list(_words(key))


def warm_keys() -> None:
    """Runs every key derivation of a turn once, so that their small programs are compiled before agents wait on
    them (a run's warm-up calls it: afterwards no turn traces or compiles anything)."""
    key_data(turn_key(tree_key(0, 0, "warm-up", 0), "root", 0))
    jax.random.key_data(jax.random.key(0))
