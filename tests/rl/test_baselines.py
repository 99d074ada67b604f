"""Baselines and weights (docs/design/algorithm.md §5.1–5.6): §13 vectors and properties."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sera_jax.rl.baselines import (
    apply_depth_weights, assign_rubric_advantages, depth_weights, execution_advantages, gamma_depth_weights,
    is_zero_variance, loo_advantages, root_balanced_advantages, step_is_skipped,
)
from sera_jax.rl.datums import Datum


def test_rubric_loo_vector_section_13():
    a = loo_advantages([-0.0083333, -0.1, -0.05], [7, 7, 7])
    np.testing.assert_allclose(np.asarray(a), [0.0666667, -0.0708333, 0.0041667], atol=1e-6)


def test_single_group_member_gets_zero():
    a = np.asarray(loo_advantages([0.3, -0.2, 0.9], ["a", "b", "b"]))
    assert a[0] == 0.0
    np.testing.assert_allclose(a[1:], [-1.1, 1.1], atol=1e-6)
    assert np.asarray(loo_advantages([], [])).shape == (0,)


@settings(max_examples=100, deadline=None)
@given(st.lists(st.tuples(st.floats(-5, 5, allow_nan=False), st.integers(0, 4)), min_size=1, max_size=24))
def test_loo_sums_to_zero_within_each_group(rows):
    v = np.array([r[0] for r in rows], np.float64)
    g = np.array([r[1] for r in rows])
    a = np.asarray(loo_advantages(v, g), np.float64)
    for gid in np.unique(g):
        sel = g == gid
        assert abs(a[sel].sum()) <= 1e-4 * max(1.0, np.abs(v[sel]).sum())
        if sel.sum() > 1:  # and each entry is v_i minus the mean of the others
            i = np.flatnonzero(sel)[0]
            others = np.delete(v[sel], 0)
            assert a[i] == pytest.approx(v[i] - others.mean(), abs=1e-4)


def test_execution_loo_section_5_1():
    R = [1, 0, 0, 1, 0, 0, 0, 0]
    # rollout 0 root, rollout 0 sub-agent scored 0.7, rollout 1 root
    a = execution_advantages([1.0, 0.7, 0.0], [0, 0, 1], R)
    np.testing.assert_allclose(a, [0.857143, 0.557143, -0.285714], atol=1e-6)
    # N = 1: r − mean(R)
    np.testing.assert_allclose(execution_advantages([1.0, 0.4], [0, 0], [1.0]), [0.0, -0.6])


def test_delegation_root_balanced_section_5_4():
    # rollout 0: events r=1, 0.5 and an invalid attempt r=0; rollout 1: r=1; rollout 2: r=0; 3..7 none
    a = root_balanced_advantages([1.0, 0.5, 0.0, 1.0, 0.0], [0, 0, 0, 1, 2], 8)
    np.testing.assert_allclose(a, [0.857143, 0.357143, -0.142857, 0.928571, -0.214286], atol=1e-6)
    with pytest.raises(ValueError):
        root_balanced_advantages([1.0], [0], 1)


def test_depth_weights_section_5_5():
    w = depth_weights({0: 8, 1: 16}, {0: 8, 1: 20})
    assert w[0] == pytest.approx(1.555556, abs=1e-6) and w[1] == pytest.approx(0.777778, abs=1e-6)
    assert depth_weights({0: 0, 1: 2}, {0: 0, 1: 3}) == {0: 0.0, 1: pytest.approx(1.0)}


def test_gamma_depth_weights_section_5_5():
    np.testing.assert_allclose(gamma_depth_weights([0, 0, 1, 1, 2], 0.5),
                               [1.538462, 1.538462, 0.769231, 0.769231, 0.384615], atol=1e-6)


@settings(max_examples=100, deadline=None)
@given(st.dictionaries(st.integers(0, 3), st.tuples(st.integers(1, 20), st.integers(0, 30)), min_size=1))
def test_depth_weights_average_one_per_datum_and_equalise_trajectory_mass(levels):
    traj = {d: t for d, (t, _) in levels.items()}
    dat = {d: t + extra for d, (t, extra) in levels.items()}  # every trajectory has ≥ 1 datum
    w = depth_weights(traj, dat)
    assert sum(dat[d] * w[d] for d in dat) / sum(dat.values()) == pytest.approx(1.0)
    masses = [w[d] * traj[d] for d in traj]
    assert max(masses) == pytest.approx(min(masses))


def _d(reward, depth, start, trainable=True, advantage=None):
    return Datum(tokens=(1, 2), mask=(0, 1), logprobs=(0.0, -0.5), versions=(-1, 1), reward=reward,
                 objective="execution", traj_depth=depth, traj_start=start, trainable=trainable,
                 advantage=reward if advantage is None else advantage)


def test_apply_depth_weights_counts_trajectories_by_traj_start_and_drops_untrainable():
    ds = [_d(1.0, 0, 1), _d(1.0, 1, 1), _d(1.0, 1, 0), _d(1.0, 1, 1), _d(9.0, 2, 1, trainable=False)]
    out = apply_depth_weights(ds)
    assert len(out) == 4
    w = depth_weights({0: 1, 1: 2}, {0: 1, 1: 3})
    np.testing.assert_allclose([d.weight for d in out], [w[0], w[1], w[1], w[1]])
    assert np.mean([d.weight for d in out]) == pytest.approx(1.0)
    assert [(d.reward, d.advantage) for d in out] == [(1.0, 1.0)] * 4  # weighting writes the weight only
    g = apply_depth_weights(ds, gamma=0.5)
    np.testing.assert_allclose([d.weight for d in g], gamma_depth_weights([0, 1, 1, 1], 0.5))


def test_rubric_advantages_k1_is_zero_and_placeholder_passes():
    ph = Datum(tokens=(), mask=(), logprobs=(), versions=(), reward=0.0, objective="rubric_generation",
               traj_depth=1, traj_start=1, trainable=False, advantage=0.0)
    (one,) = [d for d in assign_rubric_advantages([_d(-0.3, 1, 1)])]
    assert one.advantage == 0.0 and one.reward == -0.3
    out = assign_rubric_advantages([_d(-0.0083333, 1, 1), ph, _d(-0.1, 1, 1), _d(-0.05, 2, 1)])
    assert out[1] is ph
    np.testing.assert_allclose([out[0].advantage, out[2].advantage, out[3].advantage],
                               [0.0666667, -0.0708333, 0.0041667], atol=1e-6)


def test_zero_variance_and_skipped_step():
    assert is_zero_variance([0.0, 0.0, 0.0]) and is_zero_variance([])
    assert not is_zero_variance([0.0, 0.1])
    # equal root rewards give bit-identical LOO advantages
    assert is_zero_variance(execution_advantages([1.0] * 8, range(8), [1.0] * 8))
    assert step_is_skipped(7, 8) and not step_is_skipped(8, 8)
