"""Rewards (docs/design/algorithm.md §5.1–5.4): §13 vectors, skip rules, hinge properties, padded kernels, leaf coverage."""

from __future__ import annotations

import itertools

import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rl_builders import node, tree, turn
from sera_jax.agents.records import Reward, RubricScore
from sera_jax.rl.rewards import (
    env_success, execution_reward, filter_success, hinge_rank_reward, hinge_rank_rewards, leaf_coverage_rewards,
    rank_disc_reward, rank_disc_rewards, ranking_diagnostics,
)

S = [0.9, 0.5, 0, 0.4, 0, 0, 0, 0]
Y = [True, True, False, False, False, False, False, False]


def test_hinge_vector_section_13():
    assert hinge_rank_reward(S, Y) == pytest.approx(-0.0083333, abs=1e-7)
    assert hinge_rank_reward(S, Y) == pytest.approx(-0.1 / 12, rel=1e-6)


def test_rank_disc_vector_section_13():
    assert rank_disc_reward(S, Y) == pytest.approx(0.7983453, abs=1e-6)
    # the two halves of the vector: R_order = 0.9583333 (disc weight 0), R_disc = 0.6383573 (order weight 0)
    assert rank_disc_reward(S, Y, order_weight=1.0, disc_weight=0.0) == pytest.approx(0.9583333, abs=1e-6)
    assert rank_disc_reward(S, Y, order_weight=0.0, disc_weight=1.0) == pytest.approx(0.6383573, abs=1e-6)


def test_rank_disc_rejects_bad_weights():
    with pytest.raises(ValueError):
        rank_disc_reward(S, Y, order_weight=0.7, disc_weight=0.5)
    with pytest.raises(ValueError):
        rank_disc_reward(S, Y, scale=-1.0)


@pytest.mark.parametrize("fn", [hinge_rank_reward, rank_disc_reward])
def test_skip_rules(fn):
    assert fn([0.9, 0.8], [True, True]) is None            # homogeneous
    assert fn([0.1, 0.0, 0.2], [False, False, False]) is None
    assert fn([0.9, None, None], [True, False, False]) is None  # invalid scores are excluded, not zeros
    assert fn([0.9, 0.1, 0.5], [True, None, None]) is None     # judge failures are excluded too
    assert fn([], []) is None
    assert fn([0.9, 0.1], [True, False]) is not None


def test_invalid_score_is_removed_not_counted_as_zero():
    # With the 0.45 branch invalid, only (0.5 vs 0.4) remains: hinge 0.1 on one pair.
    assert hinge_rank_reward([0.5, 0.4, None], [True, False, False]) == pytest.approx(-0.1, abs=1e-6)
    # Counting it as 0 would have given a second, satisfied pair.
    assert hinge_rank_reward([0.5, 0.4, 0.0], [True, False, False]) == pytest.approx(-0.05, abs=1e-6)


scores_st = st.lists(st.floats(0.0, 1.0, allow_nan=False, width=32), min_size=2, max_size=8)


@settings(max_examples=150, deadline=None)
@given(data=st.data())
def test_hinge_zero_iff_all_pairs_satisfy_margin_and_never_positive(data):
    s = data.draw(scores_st)
    y = data.draw(st.lists(st.booleans(), min_size=len(s), max_size=len(s)))
    r = hinge_rank_reward(s, y)
    if all(y) or not any(y):
        assert r is None
        return
    s32 = np.asarray(s, np.float32)
    ok = all(s32[i] - s32[j] >= np.float32(0.2) for i, j in itertools.product(range(len(s)), repeat=2)
             if y[i] and not y[j])
    assert r <= 0.0
    assert (r == 0.0) == ok


@settings(max_examples=40, deadline=None)
@given(st.lists(st.tuples(st.floats(0, 1, width=32), st.booleans(), st.booleans()), min_size=1, max_size=8),
       st.integers(1, 4))
def test_padded_kernels_match_per_group(rows, groups):
    # The same group repeated with different padding: every row must give the scalar result.
    B = 8
    s = np.zeros((groups, B), np.float32)
    y = np.zeros((groups, B), bool)
    v = np.zeros((groups, B), bool)
    for g in range(groups):
        for k, (sc, lab, ok) in enumerate(rows):
            s[g, k], y[g, k], v[g, k] = sc, lab, ok
        s[g, len(rows):] = 0.77 * g  # garbage in padding must not leak
    hinge, ranked = hinge_rank_rewards(jnp.asarray(s), jnp.asarray(y), jnp.asarray(v))
    rd, ranked2 = rank_disc_rewards(jnp.asarray(s), jnp.asarray(y), jnp.asarray(v))
    scal = [sc if ok else None for sc, _, ok in rows]
    labs = [lab for _, lab, _ in rows]
    h1, r1 = hinge_rank_reward(scal, labs), rank_disc_reward(scal, labs)
    assert np.all(np.asarray(ranked) == (h1 is not None)) and np.all(np.asarray(ranked2) == (r1 is not None))
    if h1 is not None:
        np.testing.assert_allclose(np.asarray(hinge), h1, atol=1e-6)
        np.testing.assert_allclose(np.asarray(rd), r1, atol=1e-6)
    else:
        assert np.all(np.asarray(hinge) == 0.0)


def test_ranking_diagnostics():
    d = ranking_diagnostics(S, Y)
    assert d["pairwise_accuracy"] == pytest.approx(1.0)       # every success scores above every failure
    assert d["margin_satisfaction"] == pytest.approx(11 / 12)
    assert d["mean_hinge"] == pytest.approx(0.1 / 12)
    assert d["mean_gap"] == pytest.approx(np.mean([0.9 - 0.4, 0.9, 0.5 - 0.4, 0.5] + [0.9] * 4 + [0.5] * 4))


# ---------------------------------------------------------------------------------------------- execution

def test_execution_reward_root_sub_rao_and_errors():
    root = node("r", turns=[turn(0, [1], [2])], reward=Reward(environment=1.0))
    sub = node("s", parent="r", fork_step=0, depth=1, turns=[turn(0, [1], [2])],
               reward=Reward(environment=0.0, rubric_score=0.7), rubric_score=RubricScore(0.7, True, 0.0))
    assert execution_reward(root, is_root=True, mode="rubric") == 1.0
    assert execution_reward(sub, is_root=False, mode="rubric") == pytest.approx(0.7)
    assert execution_reward(sub, is_root=False, mode="rao") == 0.0   # the env value, not the score
    assert filter_success(sub) == 1.0
    unscored = node("u", parent="r", fork_step=0, turns=[turn(0, [1], [2])], reward=Reward(environment=1.0))
    assert execution_reward(unscored, is_root=False, mode="rubric") is None
    assert execution_reward(unscored, is_root=False, mode="rao") == 1.0
    crashed = node("x", turns=[turn(0, [1], [2])], reward=Reward(environment=1.0), rollout_error_zero_reward=True)
    assert execution_reward(crashed, is_root=True) == 0.0
    skipped = node("k", turns=[turn(0, [1], [2])], reward=Reward(environment=1.0), skip_gradient_update=True)
    assert execution_reward(skipped, is_root=True) is None
    # never graded by the environment (no finish): 0
    assert env_success(node("n", turns=[turn(0, [1], [2])], reward=Reward(judge=1.0))) == 0.0
    with pytest.raises(ValueError):
        execution_reward(sub, is_root=False, mode="bogus")


def test_execution_reward_textworld_rao_uses_the_judge_label():
    """TW RAO sub-agents: the execution judge's label, never the world check (which means "the whole task is
    solved"); no label → not trained; TextCraft keeps its env check; the root is always the world check."""
    def child(judge=None, rubric_score=None, **kw):
        return node("c", parent="r", fork_step=0, depth=1, turns=[turn(0, [1], [2])],
                    reward=Reward(environment=0.0, judge=judge, rubric_score=rubric_score), **kw)

    tw = "textworld_sync"
    done = child(judge=1.0)
    assert env_success(done) == 0.0
    assert execution_reward(done, is_root=False, mode="rao", env=tw) == 1.0
    assert execution_reward(done, is_root=False, mode="rao") == 1.0              # a label wins wherever it is
    assert execution_reward(child(judge=0.0), is_root=False, mode="rao", env=tw) == 0.0
    assert execution_reward(child(), is_root=False, mode="rao", env=tw) is None  # no label: not trained
    assert execution_reward(child(), is_root=False, mode="rao", env="textcraft") == 0.0
    solved = node("s", parent="r", fork_step=0, depth=1, turns=[turn(0, [1], [2])], reward=Reward(environment=1.0))
    assert execution_reward(solved, is_root=False, mode="rao", env="textcraft") == 1.0
    assert execution_reward(solved, is_root=False, mode="rao", env=tw) is None
    crashed = child(judge=1.0, rollout_error_zero_reward=True)
    assert execution_reward(crashed, is_root=False, mode="rao", env=tw) == 0.0
    failed = child(skip_gradient_update=True)                                   # the judge call failed
    assert execution_reward(failed, is_root=False, mode="rao", env=tw) is None
    root = node("r", turns=[turn(0, [1], [2])], reward=Reward(environment=1.0, judge=0.0))
    assert execution_reward(root, is_root=True, mode="rao", env=tw) == 1.0
    # SERA variants on TextWorld keep the rubric score
    scored = child(rubric_score=0.4, judge=1.0)
    assert execution_reward(scored, is_root=False, mode="rubric", env=tw) == pytest.approx(0.4)


# ---------------------------------------------------------------------------------------------- delegation

def test_leaf_coverage_weights():
    # r launches a and b at step 0; a launches a1, a2 at step 1; b launches nothing. Leaves: a1, a2, b.
    t = tree("t", [node("r", turns=[turn(0, [1], [2])], success=1.0),
                   node("a", parent="r", fork_step=0, depth=1, turns=[turn(0, [1], [2]), turn(1, [1], [2])]),
                   node("b", parent="r", fork_step=0, depth=1, turns=[turn(0, [1], [2])]),
                   node("a1", parent="a", fork_step=1, depth=2), node("a2", parent="a", fork_step=1, depth=2),
                   node("bad", parent="b", fork_step=5, depth=2)])  # fork step outside b's turns
    events, excluded = leaf_coverage_rewards(t)
    # "bad" is itself a leaf of b's subtree, so leaves = a1, a2, bad; b's event is dropped (defensive rule)
    assert excluded == {"b"}
    got = {(e.parent_id, e.fork_step): (e.child_ids, e.weight, e.reward) for e in events}
    assert got == {("r", 0): (("a", "b"), 1.0, 1.0), ("a", 1): (("a1", "a2"), pytest.approx(2 / 3),
                                                                   pytest.approx(2 / 3))}
    zero, _ = leaf_coverage_rewards(t, root_reward=0.0)
    assert all(e.reward == 0.0 for e in zero)


def test_leaf_coverage_success_gate():
    t = tree("t", [node("r", turns=[turn(0, [1], [2])], success=1.0),
                   node("a", parent="r", fork_step=0, depth=1, turns=[turn(0, [1], [2])], success=1.0),
                   node("b", parent="r", fork_step=0, depth=1, turns=[turn(0, [1], [2])], success=0.0)])
    (ev,), _ = leaf_coverage_rewards(t, success_gate=True)
    assert ev.weight == 0.5
    (ev,), _ = leaf_coverage_rewards(t)
    assert ev.weight == 1.0


def test_credit_of_new_group_sizes_traces_nothing_new():
    """The ranking rewards and LOO baselines run on host-padded arrays: a new group size reuses the compiled kernels
    (an eager jnp pad or slice would compile a program per size in every rubric step)."""
    from sera_jax.rl.baselines import loo_advantages
    from sera_jax.rl.rewards import hinge_rank_reward, rank_disc_reward
    from sera_jax.sampling import compile_watch

    compile_watch.install()
    loo_advantages([1.0, 0.0, 1.0], [0, 0, 0])
    hinge_rank_reward([0.9, 0.1, None, 0.5], [True, False, True, False])
    rank_disc_reward([0.9, 0.1], [True, False])
    before = compile_watch.snapshot()["traces"]
    adv = loo_advantages([1.0, 0.0, 1.0, 0.0, 1.0], [0, 0, 0, 1, 1])
    r = hinge_rank_reward([0.9, 0.1, 0.2, 0.3, 0.8, 0.1], [True, False, True, False, True, False])
    d = rank_disc_reward([0.9, 0.1, 0.3], [True, False, False])
    assert compile_watch.snapshot()["traces"] == before
    np.testing.assert_allclose(adv, [0.5, -1.0, 0.5, -1.0, 1.0])
    assert r == pytest.approx(-(0.1 + 0.3 + 0.1) / 9, abs=1e-6) and 0 < d <= 1  # the 0.2 success: 3 hinges


def test_warm_credit_leaves_nothing_to_compile():
    from sera_jax.rl.baselines import loo_advantages, warm_credit
    from sera_jax.rl.rewards import hinge_rank_reward, rank_disc_reward
    from sera_jax.sampling import compile_watch

    compile_watch.install()
    warm_credit(max_datums=32)
    before = compile_watch.snapshot()["traces"]
    loo_advantages([1.0] * 20 + [0.0] * 7, [0] * 27)       # padded to 32
    hinge_rank_reward([0.2] * 5 + [0.9] * 3, [False] * 5 + [True] * 3)
    rank_disc_reward([0.2, 0.9, 0.5], [False, True, True])
    assert compile_watch.snapshot()["traces"] == before
