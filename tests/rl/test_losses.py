"""CISPO and the plain policy-gradient loss (docs/design/algorithm.md §6): §13 vector, exact gradients, micro-batch invariance."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rl_builders import random_datums
from sera_jax.rl.batch import pack_datums
from sera_jax.rl.losses import LOSSES, cispo_loss, get_loss, loss_on_batch, pg_loss, register_loss


def test_coefficient_clips_at_5_section_13():
    # ρ = 7 on the first token, A = 1, N = 3 masked tokens
    logp = jnp.array([[-1.0, -2.0, -0.5, -3.0]])
    old = logp - jnp.array([[np.log(7.0), 0.0, 0.0, 0.0]])
    adv = jnp.ones((1, 4))
    mask = jnp.array([[1.0, 1.0, 1.0, 0.0]])
    g = jax.grad(cispo_loss)(logp, old, adv, mask)
    np.testing.assert_allclose(np.asarray(g), [[-5.0 / 3, -1.0 / 3, -1.0 / 3, 0.0]], rtol=1e-6)
    loss = cispo_loss(logp, old, adv, mask)
    assert float(loss) == pytest.approx(-(5 * -1.0 + 1 * -2.0 + 1 * -0.5) / 3, rel=1e-6)


@pytest.mark.parametrize("seed", range(5))
def test_gradient_is_minus_clipped_ratio_times_advantage_over_n(seed):
    rng = np.random.default_rng(seed)
    shape = (3, 17)
    logp = jnp.asarray(-rng.exponential(1.0, shape), jnp.float32)
    old = jnp.asarray(np.asarray(logp) + rng.normal(0, 1.5, shape), jnp.float32)  # ratios well above 5 and ~0
    adv = jnp.asarray(rng.normal(0, 1, shape), jnp.float32)
    mask = jnp.asarray(rng.integers(0, 2, shape), jnp.float32)
    n_global = int(mask.sum()) + 11  # as if other micro-batches held 11 more tokens
    lo, hi = 0.2, 3.0
    g = jax.grad(cispo_loss)(logp, old, adv, mask, ratio_min=lo, ratio_max=hi, num_tokens=n_global)
    ratio = np.exp(np.asarray(logp, np.float64) - np.asarray(old, np.float64))
    want = -np.clip(ratio, lo, hi) * np.asarray(adv) / n_global * np.asarray(mask)
    np.testing.assert_allclose(np.asarray(g), want, rtol=1e-5, atol=1e-8)
    assert np.any(ratio > hi) and np.any(ratio < lo)  # both clips exercised


def test_padding_with_minus_inf_does_not_poison_the_loss():
    logp = jnp.array([[-1.0, -jnp.inf]])
    old = jnp.array([[-1.0, 0.0]])
    adv = jnp.array([[2.0, 0.0]])
    mask = jnp.array([[1.0, 0.0]])
    assert float(cispo_loss(logp, old, adv, mask)) == pytest.approx(2.0)
    assert np.all(np.isfinite(np.asarray(jax.grad(cispo_loss)(logp, old, adv, mask))))
    assert float(cispo_loss(logp, old, adv, jnp.zeros_like(mask))) == 0.0


def test_registry_and_pg():
    assert get_loss("cispo") is cispo_loss and get_loss("pg") is pg_loss and set(LOSSES) >= {"cispo", "pg"}
    with pytest.raises(KeyError):
        get_loss("ppo")
    with pytest.raises(ValueError):
        register_loss("cispo")(pg_loss)
    logp = jnp.array([[-1.0, -2.0, -0.5]])
    adv = jnp.array([[1.0, -2.0, 3.0]])
    mask = jnp.array([[1.0, 1.0, 0.0]])
    assert float(pg_loss(logp, logp + 9.0, adv, mask)) == pytest.approx(-(-1.0 + 4.0) / 2)
    # with on-policy logprobs (ratio 1) CISPO and PG coincide
    assert float(cispo_loss(logp, logp, adv, mask)) == pytest.approx(float(pg_loss(logp, logp, adv, mask)))


# ------------------------------------------------------------------------- micro-batch invariance (toy model)

V, P = 50, 64


def _params(key):
    k1, k2 = jax.random.split(key)
    return {"emb": jax.random.normal(k1, (V, V)) * 0.5, "pos": jax.random.normal(k2, (P, V)) * 0.1}


@jax.jit
def _toy_logp(params, tokens, positions, targets):
    # Depends on the token and its position, so misplaced positions would change the loss.
    logits = params["emb"][tokens] + params["pos"][positions]
    return jnp.take_along_axis(jax.nn.log_softmax(logits), targets[..., None], axis=-1)[..., 0]


def _step_loss(params, micro_batches, name="cispo"):
    total = 0.0
    for mb in micro_batches:
        total = total + loss_on_batch(_toy_logp(params, mb.tokens, mb.positions, mb.targets), mb, name)
    return total


@pytest.mark.parametrize("name", ["cispo", "pg"])
def test_one_or_four_unequal_micro_batches_give_equal_loss_and_gradients(name):
    rng = np.random.default_rng(7)
    ds = random_datums(rng, 18)
    params = _params(jax.random.PRNGKey(0))
    whole = pack_datums(ds, token_budget=100_000, buckets=(64,))
    assert len(whole.micro_batches) == 1
    # four unequal shares, each packed alone but normalised by the step's global token count
    cuts = [0, 1, 4, 10, 18]
    parts = [pack_datums(ds[a:b], token_budget=128, buckets=(64,), num_tokens=whole.num_tokens)
             for a, b in zip(cuts, cuts[1:])]
    split = [mb for p in parts for mb in p.micro_batches]
    assert len(split) >= 4 and len({int(mb.loss_mask.sum()) for mb in split}) > 1
    l1, g1 = jax.value_and_grad(_step_loss)(params, whole.micro_batches, name)
    l4, g4 = jax.value_and_grad(_step_loss)(params, split, name)
    assert float(l4) == pytest.approx(float(l1), rel=1e-5)
    for k in params:
        np.testing.assert_allclose(np.asarray(g4[k]), np.asarray(g1[k]), rtol=1e-4, atol=1e-7)
    # the budget-driven split inside one pack_datums call agrees too
    many = pack_datums(ds, token_budget=128, buckets=(64,))
    assert len(many.micro_batches) > 1
    lm = _step_loss(params, many.micro_batches, name)
    assert float(lm) == pytest.approx(float(l1), rel=1e-5)
