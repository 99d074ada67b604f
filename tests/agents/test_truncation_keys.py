"""The §1.3 truncation rule on real encodings, and the stable per-turn keys."""

from __future__ import annotations

import jax

from sera_jax.agents.keys import key_data, stable_hash, tree_key, turn_key
from sera_jax.agents.truncation import build_prompt


def _msgs(n_pairs: int, size: int = 40) -> list[dict]:
    m = [{"role": "system", "content": "system rules " * 5}, {"role": "user", "content": "the task " * 5}]
    for k in range(n_pairs):
        m += [{"role": "assistant", "content": f"reply {k} " * size}, {"role": "user", "content": f"obs {k} " * size}]
    return m


def test_fits_unchanged(tok):
    msgs = _msgs(2)
    p = build_prompt(tok, msgs, 10_000)
    assert p.ids == tok.encode_chat(msgs) and p.messages == msgs and p.dropped_pairs == 0 and not p.head_tail


def test_oldest_pairs_are_deleted_first(tok):
    msgs = _msgs(6)
    full = len(tok.encode_chat(msgs))
    cap = len(tok.encode_chat(msgs[:2] + msgs[6:])) + 1  # room for the last 4 pairs only
    p = build_prompt(tok, msgs, cap)
    assert p.full_len == full and p.dropped_pairs == 2 and not p.head_tail
    assert p.messages == msgs[:2] + msgs[6:] and p.ids == tok.encode_chat(p.messages)
    assert len(p.ids) <= cap


def test_head_and_tail_when_pairs_are_not_enough(tok):
    msgs = [{"role": "system", "content": "rules " * 200}, {"role": "user", "content": "task " * 200},
            {"role": "assistant", "content": "a " * 50}, {"role": "user", "content": "last observation " * 30}]
    cap = 300
    p = build_prompt(tok, msgs, cap)
    assert p.head_tail and len(p.ids) == cap
    assert p.dropped_pairs == 1 and p.messages == msgs[:2]  # the one pair went first
    head = tok.encode_chat(msgs[:2], add_generation_prompt=False)[:cap]
    assert len(head) == cap and p.ids == head  # no room left for a tail: only the cut prefix is sent


def test_head_plus_tail_tokens(tok):
    msgs = [{"role": "system", "content": "rules " * 20}, {"role": "user", "content": "task " * 400}]
    head_all = tok.encode_chat(msgs, add_generation_prompt=False)
    full = tok.encode_chat(msgs)
    cap = len(head_all) - 5  # the head is cut to the cap, leaving no tail
    p = build_prompt(tok, msgs, cap)
    assert p.ids == head_all[:cap]
    # A system + task that fits only without the generation prompt gets head + the tail of the full encoding.
    cap = len(full) - 1
    p = build_prompt(tok, msgs, cap)
    tail = cap - len(head_all)
    assert tail > 0 and p.ids == head_all + full[-tail:] and len(p.ids) == cap
    assert tok.decode(p.ids).endswith("<|im_end|>\nassistant\n")  # (spec quirk: the tail may split a tag)


def test_turn_keys_are_stable_and_distinct():
    assert stable_hash("root/subagent-0-1") == stable_hash("root/subagent-0-1") == 779034753
    k = tree_key(0, 5, "task-a", 2)
    assert key_data(k) == key_data(tree_key(0, 5, "task-a", 2))
    others = [tree_key(1, 5, "task-a", 2), tree_key(0, 6, "task-a", 2), tree_key(0, 5, "task-b", 2),
              tree_key(0, 5, "task-a", 3)]
    assert len({tuple(key_data(x)) for x in others + [k]}) == 5
    turns = {tuple(key_data(turn_key(k, p, t))) for p in ("root", "root/subagent-0-0") for t in range(3)}
    assert len(turns) == 6
    assert jax.random.key_data(turn_key(k, "root", 0)).dtype == jax.numpy.uint32


def test_host_derived_keys_equal_jax_random_fold_in():
    # tree_key / turn_key derive in plain integers (issue #57: eager JAX was the loop's largest cost); the words are
    # exactly jax.random's.
    for seed, version, task, rollout in ((0, 0, "t", 0), (353, 17, "textcraft_synth.train.5", 7), (2**32 - 1, 3, "", 1)):
        k = jax.random.key(seed)
        for d in (version, stable_hash(task), rollout):
            k = jax.random.fold_in(k, d)
        assert key_data(tree_key(seed, version, task, rollout)) == key_data(k)
        for path, turn in (("root", 0), ("root/subagent-0-1", 19), ("rubric:root#2", 2**31 - 1)):
            want = jax.random.fold_in(jax.random.fold_in(k, stable_hash(path)), turn)
            assert key_data(turn_key(tree_key(seed, version, task, rollout), path, turn)) == key_data(want)
