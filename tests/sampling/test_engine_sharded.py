"""The engine over 8 fake CPU devices (data 4 × tensor 2 under SAMPLE_RULES) gives the tokens of the 1-device one."""

from __future__ import annotations

import jax
import numpy as np

from sera_jax.parallel import MeshConfig, make_mesh
from sera_jax.sampling import Engine, SamplingParams
from tests.sampling.conftest import ToyTokenizer, engine_config, random_prompts, run


def test_eight_device_engine_matches_one_device(engine, cfg, params):
    assert len(jax.devices()) == 8
    mesh = make_mesh(MeshConfig(data=4, fsdp=1, tensor=2))
    eng = Engine(cfg, params, engine_config(), mesh=mesh, tokenizer=ToyTokenizer())
    try:
        # The sampler layout is real: kv heads and the pool's kv-head axis are split over tensor.
        k_proj = eng.params["layers"]["attn"]["k_proj"]
        assert k_proj.addressable_shards[0].data.shape[2] == cfg.num_kv_heads // 2
        assert eng.pool["k"].addressable_shards[0].data.shape[3] == cfg.num_kv_heads // 2
        prompts = random_prompts(51, 10, 3, 90)
        sps = [SamplingParams(max_new_tokens=16, temperature=float(i % 2), top_p=1.0 if i % 3 else 0.9)
               for i in range(10)]
        keys = [jax.random.key(100 + i) for i in range(10)]
        many = run([eng.generate(p, sp, key=k) for p, sp, k in zip(prompts, sps, keys)])
        one = run([engine.generate(p, sp, key=k) for p, sp, k in zip(prompts, sps, keys)])
        for a, b in zip(many, one):
            assert a.token_ids == b.token_ids
            np.testing.assert_allclose(a.logprobs, b.logprobs, atol=1e-4)
    finally:
        eng.close()
