"""The CPU shape rule: few compiled shapes, prefill pieces of at most 512 tokens, every context reachable."""

from __future__ import annotations

import pytest

from sera_jax.config import load_config
from sera_jax.sampling import EngineConfig
from sera_jax.sampling.engine_config import cpu_shapes


@pytest.mark.parametrize("context", [40, 64, 300, 512, 1024, 4096])
def test_cpu_shapes_cover_every_context_with_short_prefill_pieces(context):
    ec = EngineConfig(max_batch=32, max_context=context, num_blocks=4096, dtype="float32", **cpu_shapes(32, context))
    b = ec.buckets()
    assert b["batch"] == (4, 8, 16, 32) and b["prefill_batch"] == (2,)  # decode rows: the live slots' power of two
    full = -(-context // 16)
    # Decode widths: a quarter, a half and the whole table (fewer for tiny contexts); the engine splits a round's
    # rows by the width they need (up to decode_groups=4 chunks) and admits with two prefill calls a round.
    assert b["width"][-1] == full and len(b["width"]) <= 3 and ec.decode_groups == 4 and ec.prefill_calls == 2
    # Prefill reads only the cached context: none (a first prefill), a quarter, a half or the whole table.
    assert b["prefill_ctx"][0] == 0 and b["prefill_ctx"][-1] == full and len(b["prefill_ctx"]) <= 4
    assert b["prefill_len"][-1] == ec.max_prefill_len == min(512, context)
    assert all(n <= 512 for n in b["prefill_len"]) and len(b["prefill_len"]) <= 4


def test_the_tiny_default_engines_use_the_cpu_shapes():
    from sera_jax.assembly.engines import engine_config

    cfg = load_config(["configs/tiny_cpu.yaml"])
    train_ec = engine_config(cfg, "float32")
    eval_ec = engine_config(cfg, "float32", evaluation=True)
    for ec, ctx in ((train_ec, cfg.rollout.context_tokens), (eval_ec, cfg.eval.context_tokens)):
        assert ec.prefill_len_buckets == (64, 128, 256, 512) and ec.max_prefill_len == 512
        full = -(-ctx // 16)
        assert ec.width_buckets == (full // 4, full // 2, full) and ec.batch_buckets[-1] == ec.max_batch
        assert ec.prefill_ctx_buckets == (0, full // 4, full // 2, full)
        assert all(b >= 4 and b & (b - 1) == 0 for b in ec.batch_buckets[:-1])
