"""The engine computes what the trainer's model computes: greedy tokens, behaviour logprobs, stop rules."""

from __future__ import annotations

import jax
import numpy as np
import pytest

from sera_jax.sampling import Engine, SamplingParams
from tests.sampling.conftest import REF_LEN, Reference, ToyTokenizer, engine_config, random_prompts, run

GREEDY = SamplingParams(max_new_tokens=20, temperature=0.0)


def test_greedy_equals_uncached_argmax_and_logprobs_equal_token_logprobs(engine, ref):
    # Lengths cover: under one block, exact block multiples, and a prompt prefilled in two pieces (> 64 tokens).
    prompts = random_prompts(1, 6, 3, 40) + [random_prompts(2, 1, 16, 16)[0], random_prompts(3, 1, 90, 90)[0]]
    results = run([engine.generate(p, GREEDY) for p in prompts])
    worst = 0.0
    for p, r in zip(prompts, results):
        assert r.finish_reason == "length" and len(r.token_ids) == 20
        assert list(r.token_ids) == ref.greedy(p, 20)
        worst = max(worst, float(np.max(np.abs(np.asarray(r.logprobs) - ref.logprobs(p, r.token_ids)))))
        assert r.prompt_len == len(p) and r.policy_version == engine.version
    print(f"fp32 max |engine logprob - token_logprobs| = {worst:.2e}")
    assert worst <= 1e-4


def test_sampled_logprobs_are_at_temperature_one(engine, ref):
    p = random_prompts(4, 1, 20, 20)[0]
    r = run(engine.generate(p, SamplingParams(max_new_tokens=16, temperature=0.7, top_p=0.9),
                            key=jax.random.key(3)))
    assert np.max(np.abs(np.asarray(r.logprobs) - ref.logprobs(p, r.token_ids))) <= 1e-4


def test_bf16_sampler_gap(cfg, params, ref):
    """bf16 sampler (bf16 weights, activations, KV cache) vs the fp32 trainer and vs a bf16-compute trainer."""
    eng = Engine(cfg, params, engine_config(dtype="bfloat16", width_buckets=(16,), prefill_len_buckets=(64,)))
    ref16 = Reference(cfg.replace(dtype="bfloat16"), params)
    try:
        prompts = random_prompts(5, 4, 10, 40)
        results = run([eng.generate(p, GREEDY) for p in prompts])
        gap32 = np.concatenate([np.abs(np.asarray(r.logprobs) - ref.logprobs(p, r.token_ids))
                                for p, r in zip(prompts, results)])
        gap16 = np.concatenate([np.abs(np.asarray(r.logprobs) - ref16.logprobs(p, r.token_ids))
                                for p, r in zip(prompts, results)])
        print(f"bf16 sampler vs fp32 token_logprobs: max |gap| = {gap32.max():.3e}, mean = {gap32.mean():.3e}; "
              f"vs bf16-compute token_logprobs: max = {gap16.max():.3e}, mean = {gap16.mean():.3e}")
        # Rounding gaps, not a different computation (a wrong token or position would be O(1) on most tokens).
        assert gap32.mean() < 0.1 and gap16.mean() < 0.1
        assert np.median(gap32) < 0.02
    finally:
        eng.close()


def test_output_independent_of_batch_admission_time_and_prefix_cache(engine):
    rs = np.random.RandomState(11)
    target = rs.randint(0, 512, 37).tolist()
    key = jax.random.key(42)
    sp = SamplingParams(max_new_tokens=24, temperature=1.0)
    alone = run(engine.generate(target, sp, key=key))

    async def crowded():
        # Other requests of other lengths admitted first, the target joins mid-decode of the others.
        import asyncio
        others = [asyncio.ensure_future(engine.generate(p, SamplingParams(max_new_tokens=30), key=jax.random.key(i)))
                  for i, p in enumerate(random_prompts(12, 7, 5, 60))]
        await asyncio.sleep(0.05)
        res = await engine.generate(target, sp, key=key)
        await asyncio.gather(*others)
        return res

    crowd = run(crowded())
    # Its prefix was cached by the previous runs: now 4 full blocks come from the cache.
    cached = run(engine.generate(target, sp, key=key))
    assert cached.cached_prompt_tokens == 32
    assert alone.token_ids == crowd.token_ids == cached.token_ids
    np.testing.assert_allclose(alone.logprobs, cached.logprobs, atol=1e-4)  # fp32 summation order
    np.testing.assert_allclose(alone.logprobs, crowd.logprobs, atol=1e-4)
    # A longer prompt extending a cached generation reuses prompt + generated blocks.
    follow = target + list(alone.token_ids) + [5, 6, 7]
    r = run(engine.generate(follow, GREEDY))
    assert r.cached_prompt_tokens == ((len(target) + len(alone.token_ids) - 1) // 8) * 8


def test_eight_identical_prompts_prefill_once(engine):
    prompt = random_prompts(13, 1, 61, 61)[0]
    before = engine.stats()["prefill_tokens"]
    results = run([engine.generate(prompt, SamplingParams(max_new_tokens=4), key=jax.random.key(i))
                   for i in range(8)])
    prefilled = engine.stats()["prefill_tokens"] - before
    # First request computes all 61; the other 7 reuse its 7 full blocks and compute only the last block's 5.
    assert prefilled == 61 + 7 * 5, prefilled
    assert sorted(r.cached_prompt_tokens for r in results) == [0] + [56] * 7


def test_sampling_is_deterministic_given_key(engine):
    p = random_prompts(14, 1, 25, 25)[0]
    sps = [SamplingParams(max_new_tokens=16, temperature=1.0), SamplingParams(max_new_tokens=16, temperature=1.5,
                                                                               top_p=0.95)]
    for sp in sps:
        a, b, c = run([engine.generate(p, sp, key=jax.random.key(1)), engine.generate(p, sp, key=jax.random.key(1)),
                       engine.generate(p, sp, key=jax.random.key(2))])
        # Same key, same tokens (b reuses a's cached prefix, so logprobs agree to fp32 summation order).
        assert a.token_ids == b.token_ids
        np.testing.assert_allclose(a.logprobs, b.logprobs, atol=1e-4)
        assert a.token_ids != c.token_ids
    # top_p that keeps only the top token is greedy.
    g = run(engine.generate(p, SamplingParams(max_new_tokens=16, temperature=1.0, top_p=1e-6), key=jax.random.key(5)))
    assert g.token_ids == run(engine.generate(p, SamplingParams(max_new_tokens=16, temperature=0.0))).token_ids


def test_stop_ids_and_multi_token_stop_strings(engine):
    tok = engine.tokenizer
    p = random_prompts(15, 1, 20, 20)[0]
    full = run(engine.generate(p, SamplingParams(max_new_tokens=24, temperature=0.0))).token_ids
    # A stop id: the turn ends at its first occurrence, which is included.
    stop = full[6]
    r = run(engine.generate(p, SamplingParams(max_new_tokens=24, temperature=0.0, stop_ids=(stop,))))
    assert r.finish_reason == "stop_id" and r.token_ids == full[: full.index(stop) + 1]
    # A stop string spanning tokens 9..11 (found on the host, across chunk boundaries of 8 tokens).
    s = tok.decode(full[9:12])
    expect = next(n for n in range(1, 25) if s in tok.decode(full[:n]))
    r = run(engine.generate(p, SamplingParams(max_new_tokens=24, temperature=0.0, stop_strings=(s, "never!"))))
    assert r.finish_reason == "stop_string" and r.token_ids == full[:expect]
    assert len(r.logprobs) == len(r.token_ids)
    # The stop string's tokens, once the host has found them, end the row on device: the same turn again generates
    # no token past the stop (the host's search still decides the cut).
    learned = engine.sched.stop_seqs[s]
    assert learned and all(s in tok.decode(q) for q in learned)
    before = engine.stats()["generated_tokens"]
    again = run(engine.generate(p, SamplingParams(max_new_tokens=24, temperature=0.0, stop_strings=(s, "never!"))))
    assert again.token_ids == r.token_ids and again.finish_reason == "stop_string"
    assert engine.stats()["generated_tokens"] - before == len(again.token_ids)
    # '</python>' assembled from several pieces.
    text_ids = [6, 7, 5]  # "</" "python" ">"
    assert tok.decode(text_ids) == "</python>"


def test_decode_split_by_context_length_computes_the_same_tokens(cfg, params, ref):
    """With ``decode_groups=2`` a round's short rows decode in a narrow chunk and its long rows in a wide one, and
    prefill reads only the cached blocks; the tokens and logprobs are still the trainer's."""
    ec = engine_config(decode_groups=2, batch_buckets=(4, 8), width_buckets=(4, 16), prefill_ctx_buckets=(0, 4, 16))
    eng = Engine(cfg, params, ec, seed=7)
    shapes = []
    decode = eng._decode

    def spy(params, pool, state, index, table, alive, rows):
        shapes.append((table.shape, int(alive.sum())))
        return decode(params, pool, state, index, table, alive, rows)

    spy._cache_size = decode._cache_size  # the engine counts its compiles through it
    eng._decode = spy
    try:
        prompts = random_prompts(21, 3, 3, 10) + random_prompts(22, 2, 80, 100)
        results = run([eng.generate(p, GREEDY) for p in prompts])
        for p, r in zip(prompts, results):
            assert list(r.token_ids) == ref.greedy(p, 20)
            assert np.max(np.abs(np.asarray(r.logprobs) - ref.logprobs(p, r.token_ids))) <= 1e-4
        # A continuation past a cached prefix (prefill with a non-empty cached context) is exact too.
        follow = prompts[0] + list(results[0].token_ids) + [1, 2, 3]
        r = run(eng.generate(follow, GREEDY))
        assert r.cached_prompt_tokens > 0 and list(r.token_ids) == ref.greedy(follow, 20)
    finally:
        eng.close()
    widths = {w for (_, w), _ in shapes}
    assert widths == {4, 16}, shapes  # the short rows got the narrow table, the long ones the wide one
    assert all(live <= b for (b, _), live in shapes)


def test_dispatching_ahead_or_after_parsing_samples_the_same_tokens(cfg, params, engine):
    """``dispatch_ahead`` changes only when the host learns of finished rows, never what a row samples: agents of
    several chained turns (each prompt extending the last prompt and its completion) get the same tokens and
    logprobs either way, and the second engine reuses the first one's compiled device functions."""
    import asyncio

    assert not engine.config.dispatch_ahead  # the default: parse a round before dispatching the next
    compiled = engine.compile_count()
    ahead = Engine(cfg, params, engine_config(dispatch_ahead=True), tokenizer=engine.tokenizer, seed=7)
    assert ahead._decode is engine._decode and ahead.compile_count() == compiled

    async def agents(eng):
        async def agent(i, prompt):
            out = []
            for turn in range(3):
                r = await eng.generate(prompt, SamplingParams(max_new_tokens=6 + 5 * ((i + turn) % 3), temperature=1.0),
                                       key=jax.random.key(100 * i + turn))
                out.append(r)
                prompt = prompt + list(r.token_ids) + [7, 8, 9][: 1 + i % 3]
            return out
        return await asyncio.gather(*(agent(i, p) for i, p in enumerate(random_prompts(31, 6, 5, 40))))

    try:
        after_parse, dispatched_ahead = run(agents(engine)), run(agents(ahead))
    finally:
        ahead.close()
    for a_turns, b_turns in zip(after_parse, dispatched_ahead):
        for a, b in zip(a_turns, b_turns):
            assert a.token_ids == b.token_ids and a.finish_reason == b.finish_reason
            np.testing.assert_allclose(a.logprobs, b.logprobs, atol=1e-4)


def test_top_logprobs_are_the_full_forwards_most_likely_tokens(cfg, params, ref):
    """An engine computing 4 alternatives per token (a server's ``top_logprobs``): each position's reported top 3
    are the uncached forward's 3 most likely tokens with their temperature-1 logprobs, whatever sampled the turn; a
    turn that asks for none gets none, one that asks for more than the engine computes is refused."""
    eng = Engine(cfg, params, engine_config(top_logprobs=4), tokenizer=ToyTokenizer(), seed=7)
    try:
        prompts = random_prompts(21, 3, 10, 40)
        asks = [SamplingParams(max_new_tokens=12, temperature=1.0, top_logprobs=3),
                SamplingParams(max_new_tokens=12, temperature=0.0, top_logprobs=3),
                SamplingParams(max_new_tokens=12, temperature=1.0, stop_strings=("</python>",))]
        results = run([eng.generate(p, sp, key=jax.random.key(i)) for i, (p, sp) in enumerate(zip(prompts, asks))])
        with pytest.raises(ValueError, match="top_logprobs=5 exceeds the 4"):
            run(eng.generate(prompts[0], SamplingParams(max_new_tokens=4, top_logprobs=5)))
    finally:
        eng.close()
    assert results[2].top_logprobs == ()
    for p, r in zip(prompts[:2], results[:2]):
        assert len(r.top_logprobs) == len(r.token_ids) == 12
        seq = list(p) + list(r.token_ids)
        row = np.zeros((1, REF_LEN), np.int32)
        row[0, :len(seq)] = seq
        full = np.asarray(jax.nn.log_softmax(ref._fwd(params, row)[0], axis=-1))[len(p) - 1:len(seq) - 1]
        for pos, (top, lp_row, tok, lp) in enumerate(zip(r.top_logprobs, full, r.token_ids, r.logprobs)):
            ids, lps = [t for t, _ in top], [x for _, x in top]
            assert ids == np.argsort(-lp_row)[:3].tolist(), pos
            np.testing.assert_allclose(lps, lp_row[ids], rtol=1e-4, atol=1e-4)  # cached vs uncached rounding
            assert lps == sorted(lps, reverse=True)
            if tok in ids:
                assert abs(lps[ids.index(tok)] - lp) <= 1e-5
    assert [t for t, _ in (x[0] for x in results[1].top_logprobs)] == list(results[1].token_ids)  # greedy: top 1
