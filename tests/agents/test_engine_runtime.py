"""The runtime against the real engine and a tiny random-weight Qwen3: whatever it writes is handled and recorded."""

from __future__ import annotations

import asyncio
import io
import math

import jax
import pytest

from sera_jax.agents.harness import CURRENT_TURN
from sera_jax.agents.records import dumps_tree, read_jsonl, write_jsonl
from sera_jax.agents.runtime import run_tree, start_pool
from sera_jax.agents.settings import RuntimeSettings
from sera_jax.model import Qwen3Config, init_params
from sera_jax.parallel import MeshConfig, make_mesh
from sera_jax.sampling.engine import Engine
from sera_jax.sampling.engine_config import EngineConfig


@pytest.fixture(scope="module")
def engine(tok):
    # Vocabulary rows cover the test tokenizer (601 ids); one bucket per shape keeps CPU compilation to a minimum.
    cfg = Qwen3Config.preset("tiny", vocab_size=640)
    ec = EngineConfig(max_batch=4, batch_buckets=(4,), block_size=16, num_blocks=1024, max_context=4096,
                      chunk_steps=8, max_prefill_len=512, max_prefill_batch=2, prefill_batch_buckets=(2,),
                      prefill_len_buckets=(512,), max_prefill_tokens=1024, width_buckets=(256,), dtype="float32")
    params = init_params(jax.random.key(0), cfg)
    # Tempered logits: the random model then samples broadly (special tokens, ids past the tokenizer, fragments of
    # tags and code) instead of repeating one token, which exercises every parsing path.
    params["final_norm"]["scale"] = params["final_norm"]["scale"] * 0.05
    eng = Engine(cfg, params, ec, tokenizer=tok)
    yield eng
    eng.close()


class Recording:
    """Passes every call to the engine and keeps (who asked, what came back)."""

    def __init__(self, engine):
        self.engine, self.results = engine, []

    async def generate(self, prompt_ids, params, key=None):
        result = await self.engine.generate(prompt_ids, params, key)
        self.results.append((CURRENT_TURN.get(), list(prompt_ids), result))
        return result


def _check_records(tree, tok, engine):
    turns = [t for n in tree.nodes.values() for t in n.turns]
    assert turns, "the root took no turn"
    for t in turns:
        assert t.completion_id is not None and 0 < len(t.completion_ids) == len(t.logprobs)
        assert all(0 <= i < engine.model_cfg.vocab_size for i in t.completion_ids)  # ids past the tokenizer too
        assert all(math.isfinite(lp) and lp <= 0.0 for lp in t.logprobs)
        assert t.policy_version == 0 and t.misc["finish_reason"] in ("stop_id", "stop_string", "length")
        assert len(t.prompt_ids) <= 3500 and tok.decode(t.prompt_ids).startswith("<|im_start|>system\n")
    buf = io.StringIO()
    write_jsonl([tree], buf)
    assert list(read_jsonl(io.StringIO(buf.getvalue()))) == [tree]


def test_tiny_model_drives_both_environments(engine, tok, tc_task, tw_task):
    common = dict(max_prompt_tokens=3500, max_context=4096, max_new_tokens=24, max_steps=3)
    tc = RuntimeSettings.for_env("textcraft", **common)
    tw = RuntimeSettings.for_env("textworld_sync", **common)

    gen = Recording(engine)

    async def main():
        pool = await start_pool(1)
        try:
            # Two trees per environment at once: their turns share the engine's batches.
            return await asyncio.gather(
                run_tree(tc_task, "textcraft", gen, tok, tc, rollout_index=0, pool=pool, tree_id="tc0"),
                run_tree(tc_task, "textcraft", gen, tok, tc, rollout_index=1, pool=pool, tree_id="tc1"),
                run_tree(tw_task, "textworld_sync", gen, tok, tw, rollout_index=0, pool=pool, tree_id="tw0"),
                run_tree(tw_task, "textworld_sync", gen, tok, tw, rollout_index=1, tree_id="tw1"),
            )
        finally:
            await pool.close()

    trees = asyncio.run(main())
    # Every engine result is in the records exactly: prompt as sent, every token, its logprob and version.
    by_id = {t.id: t for t in trees}
    assert len(gen.results) == sum(len(n.turns) for t in trees for n in t.nodes.values())
    for info, prompt, result in gen.results:
        turn = by_id[info.tree_id].nodes[info.node_id].turns[info.turn]
        assert turn.prompt_ids == prompt and turn.completion_ids == list(result.token_ids)
        assert turn.logprobs == list(result.logprobs) and turn.policy_version == result.policy_version
    for tree in trees:
        assert "error" not in tree.misc
        assert not any(n.rollout_error_zero_reward for n in tree.nodes.values()), \
            [n.error_message for n in tree.nodes.values()]
        _check_records(tree, tok, engine)
        assert tree.root.env_labels["success"] in (0.0, 1.0)


def test_tiny_model_deterministic_replay(engine, tok, tc_task):
    s = RuntimeSettings.for_env("textcraft", max_prompt_tokens=3500, max_context=4096, max_new_tokens=24,
                                max_steps=2, deterministic=True, seed=9)

    async def twice():
        pool = await start_pool(1)
        try:
            return [await run_tree(tc_task, "textcraft", engine, tok, s, pool=pool) for _ in range(2)]
        finally:
            await pool.close()

    a, b = asyncio.run(twice())
    # Tokens, actions and observations replay exactly. The engine's logprobs agree only to float tolerance (the
    # second run reads its prompt from the prefix cache instead of recomputing it: ~5e-7 apart on CPU).
    ta = [t for n in a.nodes.values() for t in n.turns]
    tb = [t for n in b.nodes.values() for t in n.turns]
    assert len(ta) == len(tb) >= 2
    for x, y in zip(ta, tb):
        assert x.logprobs == pytest.approx(y.logprobs, abs=1e-5)
        x.logprobs = y.logprobs = []
    assert dumps_tree(a) == dumps_tree(b)


def test_run_trees_pins_each_tree_to_one_engine_replica(engine, tok, tw_task):
    """With one engine per device (sampling.replicas), every turn of a tree goes to the engine the tree was pinned
    to (its history stays in that engine's prefix cache), and concurrent trees spread over the engines."""
    from sera_jax.agents.runtime import run_trees
    from sera_jax.sampling.replicas import EngineReplicas

    if jax.device_count() < 2:
        pytest.skip("needs 2 (fake) devices: run via tools/run_tests.sh")
    reps = EngineReplicas([engine] + [Engine(engine.model_cfg, engine.params, engine.config, tokenizer=tok,
                                             mesh=make_mesh(MeshConfig(1, 1, 1), jax.devices()[1:2]))])

    class PinRecording:
        def __init__(self):
            self.calls = []

        def pinned(self):
            return reps.pinned()

        async def generate(self, prompt_ids, params, key=None):
            self.calls.append((CURRENT_TURN.get().tree_id, reps.engines.index(reps.pinned_engine())))
            return await reps.generate(prompt_ids, params, key)

    gen = PinRecording()
    s = RuntimeSettings.for_env("textworld_sync", max_prompt_tokens=3500, max_context=4096, max_new_tokens=24,
                                max_steps=3)
    try:
        trees = asyncio.run(run_trees([tw_task], "textworld_sync", gen, tok, s, rollouts_per_task=2))
    finally:
        reps.engines[1].close()
    owner = {}
    for tree_id, i in gen.calls:
        assert owner.setdefault(tree_id, i) == i, f"tree {tree_id} moved between engines"
    assert sorted(owner.values()) == [0, 1] and {t.id for t in trees} == set(owner)
