"""Shared fixtures for the engine tests: one tiny fp32 model and one small engine reused across tests.

XLA's CPU compiler takes seconds per executable on the CI machine, so the engine under test uses few buckets and
XLA's fast-compile options; every test measures deltas of the engine's counters rather than absolute values.
"""

from __future__ import annotations

import asyncio

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from sera_jax.model import Qwen3Config, forward, init_params, token_logprobs
from sera_jax.sampling import Engine, EngineConfig

FAST_COMPILE = (("xla_backend_optimization_level", 0), ("xla_llvm_disable_expensive_passes", True))
REF_LEN = 160  # padded length of the reference forward (≥ max_context)


class ToyTokenizer:
    """decode(ids) -> text: each id is a fixed short piece, several of which make up '</python>'."""

    PIECES = ["<", "/", "py", "th", "on", ">", "</", "python", " ", "x", "\n", "=", "1", "a", "b", "c"]

    def decode(self, ids, skip_special_tokens=False):
        return "".join(self.PIECES[int(i) % len(self.PIECES)] for i in ids)


def engine_config(**overrides) -> EngineConfig:
    base = dict(max_batch=8, block_size=8, num_blocks=48, max_context=128, chunk_steps=8, max_prefill_len=64,
                max_prefill_batch=4, max_prefill_tokens=256, min_prefill_len=16, max_stop_ids=4, dtype="float32",
                batch_buckets=(8,), prefill_batch_buckets=(4,), prefill_len_buckets=(16, 64),
                width_buckets=(4, 16), compiler_options=FAST_COMPILE)
    base.update(overrides)
    return EngineConfig(**base)


@pytest.fixture(scope="session")
def cfg():
    return Qwen3Config.preset("tiny")


@pytest.fixture(scope="session")
def params(cfg):
    # Scaled-up random weights: the plain init makes a tiny model repeat one token, which would hide bugs.
    # The embedding table is scaled to unit-variance rows (the tied init is 1/sqrt(hidden)), which keeps the logits
    # as sharp as the tests' bounds were set for.
    def scale(path, x):
        emb = "embed" in jax.tree_util.keystr(path)
        return x * (2.0 * cfg.hidden_size ** 0.5 if emb else 2.0)

    return jax.tree_util.tree_map_with_path(scale, init_params(jax.random.key(0), cfg))


@pytest.fixture(scope="session")
def engine(cfg, params):
    eng = Engine(cfg, params, engine_config(), tokenizer=ToyTokenizer(), seed=7)
    eng.warmup()
    yield eng
    eng.close()


def run(coro_or_list):
    """Runs one coroutine, or gathers a list of them, in a fresh event loop; returns the result(s)."""
    async def main():
        if isinstance(coro_or_list, list):
            return await asyncio.gather(*coro_or_list)
        return await coro_or_list
    return asyncio.run(main())


class Reference:
    """The trainer's functions on padded fixed-length rows (one compilation each), for comparison."""

    def __init__(self, cfg, params):
        self.cfg, self.params = cfg, params
        self._fwd = jax.jit(lambda p, t: forward(p, cfg, t))
        self._lp = jax.jit(lambda p, t, y: token_logprobs(p, cfg, t, y))

    def greedy(self, prompt, n):
        """Returns n tokens by step-by-step argmax of the full, uncached forward."""
        seq = list(prompt)
        for _ in range(n):
            row = np.zeros((1, REF_LEN), np.int32)
            row[0, : len(seq)] = seq
            logits = self._fwd(self.params, row)
            seq.append(int(jnp.argmax(logits[0, len(seq) - 1])))
        return seq[len(prompt):]

    def logprobs(self, prompt, completion):
        """Returns token_logprobs of ``completion`` given ``prompt`` (fp32 numpy)."""
        seq = list(prompt) + list(completion)
        tok = np.zeros((1, REF_LEN), np.int32)
        tgt = np.zeros((1, REF_LEN), np.int32)
        tok[0, : len(seq) - 1] = seq[:-1]
        tgt[0, : len(seq) - 1] = seq[1:]
        out = np.asarray(self._lp(self.params, tok, tgt))[0]
        return out[len(prompt) - 1: len(seq) - 1]


@pytest.fixture(scope="session")
def ref(cfg, params):
    return Reference(cfg, params)


def random_prompts(seed, n, lo, hi, vocab=512):
    rs = np.random.RandomState(seed)
    return [rs.randint(0, vocab, rs.randint(lo, hi + 1)).tolist() for _ in range(n)]
