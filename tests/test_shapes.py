"""The jaxtyping shapes written at module boundaries are real contracts: checked here with beartype, a call with
consistent shapes passes and one whose dimensions disagree is refused."""

import jax
import jax.numpy as jnp
import pytest
from beartype import beartype
from jaxtyping import TypeCheckError, jaxtyped

from sera_jax.model import Qwen3Config, forward, init_params, token_logprobs
from sera_jax.model.logprobs import chunked_logprobs
from sera_jax.rl.losses import cispo_loss


def checked(fn):
    return jaxtyped(typechecker=beartype)(getattr(fn, "__wrapped__", fn))


@pytest.fixture(scope="module")
def tiny():
    cfg = Qwen3Config.preset("tiny", num_layers=1)
    return cfg, init_params(jax.random.key(0), cfg)


def test_model_boundaries(tiny):
    cfg, params = tiny
    tokens = jnp.ones((2, 5), jnp.int32)
    assert checked(forward)(params, cfg, tokens).shape == (2, 5, cfg.vocab_size)
    assert checked(token_logprobs)(params, cfg, tokens, tokens).shape == (2, 5)
    with pytest.raises(TypeCheckError):
        checked(forward)(params, cfg, tokens, jnp.zeros((2, 6), jnp.int32))  # positions of another length
    with pytest.raises(TypeCheckError):
        checked(token_logprobs)(params, cfg, tokens, tokens, jnp.ones((3, 5), jnp.int32))  # segment ids
    h, u = jnp.zeros((2, 5, cfg.hidden_size)), jnp.zeros((cfg.hidden_size, cfg.vocab_size))
    assert checked(chunked_logprobs)(h, u, tokens, 4).shape == (2, 5)
    with pytest.raises(TypeCheckError):
        checked(chunked_logprobs)(h, jnp.zeros((cfg.hidden_size + 1, cfg.vocab_size)), tokens, 4)


def test_loss_boundary():
    a = jnp.zeros((2, 3))
    assert float(checked(cispo_loss)(a, a, a, a)) == 0.0
    with pytest.raises(TypeCheckError):
        checked(cispo_loss)(a, a, a, jnp.zeros((2, 4)))
