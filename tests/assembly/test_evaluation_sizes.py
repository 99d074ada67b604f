"""Evaluation's engine sizes and runtime settings come from assembly (``evaluation=True``): the ``eval`` section's
caps, rows for ``eval.concurrency`` trees, seed ``train.seed + run``; the values ``sera-eval`` used before it shared
assembly's functions."""

from __future__ import annotations

import dataclasses

import pytest

from sera_jax.assembly.engines import engine_config
from sera_jax.assembly.settings import runtime_settings
from sera_jax.config import load_config


def test_the_tiny_defaults_evaluation_engine_and_settings():
    cfg = load_config(["configs/tiny_cpu.yaml"])
    ec = engine_config(cfg, "float32", evaluation=True)
    # 16 trees at a time, a root and a sub-agent each: 32 rows; the 2 GiB CPU pool holds every row's 1,024 tokens.
    assert (ec.max_batch, ec.num_blocks, ec.max_context, ec.max_prefill_len, ec.dtype) == (
        32, 2049, 1024, 512, "float32")
    assert ec.batch_buckets == (4, 8, 16, 32) and ec.width_buckets == (16, 32, 64)
    s = runtime_settings(cfg, evaluation=True, run_index=2)
    e = cfg.eval
    assert (s.max_steps, s.max_prompt_tokens, s.max_context, s.max_new_tokens, s.temperature, s.top_p, s.seed) == (
        e.max_steps, e.max_prompt_tokens, e.context_tokens, e.max_completion_tokens, e.temperature, 1.0,
        cfg.train.seed + 2)
    assert (s.max_depth, s.prompt_style, s.token_history) == (cfg.env.max_depth, "compact", True)


@pytest.mark.parametrize("path", ["configs/paper/textcraft_sera.yaml", "configs/paper/textworld_sera.yaml"])
def test_the_paper_evaluation_engine_on_gpu(path):
    cfg = load_config([path])
    ec = engine_config(cfg, "bfloat16", evaluation=True, backend="gpu", bytes_limit=1 << 30)
    assert ec.max_batch == 128 and ec.max_context == cfg.eval.context_tokens
    assert ec.max_prefill_len == 2048 and ec.max_prefill_tokens == 8192 and ec.batch_buckets == ()
    # The served model's own config sizes the pool (a checkpoint's may differ from the config's preset).
    small = dataclasses.replace(cfg.model_config(), num_layers=1)
    assert engine_config(cfg, "bfloat16", evaluation=True, backend="gpu", model_cfg=small,
                         bytes_limit=1 << 30).num_blocks > engine_config(cfg, "bfloat16", evaluation=True,
                                                                         backend="gpu", bytes_limit=1 << 30).num_blocks


def test_training_sizes_are_unchanged_by_the_evaluation_switch():
    cfg = load_config(["configs/tiny_cpu.yaml"])
    assert engine_config(cfg, "float32", 2, evaluation=False) == engine_config(cfg, "float32", 2)
    train = runtime_settings(cfg)
    assert train.seed == cfg.train.seed and train.max_steps == cfg.env.max_steps
    assert train.max_context == cfg.rollout.context_tokens and train.top_p == cfg.rollout.top_p
