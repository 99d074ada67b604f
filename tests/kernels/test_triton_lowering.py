"""Without a GPU, the strongest check of the compiled path: every kernel lowers for CUDA to Triton custom calls.

Cross-platform lowering runs the Pallas Triton lowering rules on this CPU-only machine: unsupported primitives,
non-power-of-two tiles and bad block specs fail here. (Triton's own compile to PTX still needs a GPU.)
"""

import jax
import jax.numpy as jnp

from sera_jax.kernels.flash_attention import flash_attention
from sera_jax.kernels.paged_attention import paged_attention

S = jax.ShapeDtypeStruct
TRITON = "@__gpu$xla.gpu.triton("


def _triton_calls(fn, *args) -> int:
    text = jax.jit(fn).trace(*args).lower(lowering_platforms=("cuda",)).as_text()
    return text.count(TRITON)


def test_flash_forward_and_backward_lower_to_triton_at_qwen3_4b_head_shapes():
    b, t, h, kv, e = 1, 300, 32, 8, 128  # T not a multiple of the tiles
    q, k, seg = S((b, t, h, e), jnp.bfloat16), S((b, t, kv, e), jnp.bfloat16), S((b, t), jnp.int32)
    loss = lambda q, k, v, s: flash_attention(q, k, v, s, interpret=False).astype(jnp.float32).sum()
    assert _triton_calls(jax.grad(loss, (0, 1, 2)), q, k, k, seg) == 3  # forward, dq, dk/dv


def test_paged_attention_lowers_to_triton_for_decode_and_prefill():
    b, h, kv, e, layers, blocks, page, width = 8, 32, 8, 128, 2, 64, 16, 8
    for t_new, expected in ((1, 1), (5, 2)):  # prefill adds the flash forward for the new tokens
        args = (S((b, t_new, h, e), jnp.bfloat16), S((b, t_new, kv, e), jnp.bfloat16),
                S((b, t_new, kv, e), jnp.bfloat16), S((layers, blocks, page, kv, e), jnp.bfloat16),
                S((layers, blocks, page, kv, e), jnp.bfloat16), S((), jnp.int32), S((b, width), jnp.int32),
                S((b,), jnp.int32))
        assert _triton_calls(lambda *a: paged_attention(*a, num_splits=2, interpret=False), *args) == expected
