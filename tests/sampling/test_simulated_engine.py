"""The simulated device changes only time: a tiny oracle run on it records the trees the scripted policy records, its
programs take exactly projection's roofline time for their shapes, and an unknown target GPU is a one-line error."""

import asyncio
import dataclasses
import json
import time

import numpy as np
import pytest

from envs_py.textcraft import load_tasks, recipe_book
from sera_jax.agents.launchers.factory import make_launcher_factory
from sera_jax.agents.records import tree_to_dict
from sera_jax.agents.runtime import run_trees
from sera_jax.agents.scripted import ScriptedGenerator, script_emission
from sera_jax.assembly.settings import runtime_settings
from sera_jax.assembly.tokenizer import resolve_tokenizer
from sera_jax.config import load_config
from sera_jax.model import Qwen3Config
from sera_jax.profiling.projection import decode_roofline, prefill_roofline
from sera_jax.profiling.simulated_time import roofline_timer
from sera_jax.profiling.targets import TARGETS
from sera_jax.sampling.engine_config import EngineConfig
from sera_jax.sampling.simulated_engine import SimulatedEngine
from sera_jax.sampling.simulated_programs import SimRowState, SimulatedPrograms
from sera_jax.warmstart.oracle import TextCraftOracle

QWEN4B = Qwen3Config.preset("qwen3-4b-instruct-2507")


def _records(trees):
    """The trees as records, wall-clock fields dropped (the simulation changes only time)."""
    def strip(x):
        if isinstance(x, dict):
            return {k: strip(v) for k, v in x.items() if not any(w in k for w in ("time", "_s", "wall", "elapsed"))}
        if isinstance(x, list):
            return [strip(v) for v in x]
        return x
    return [strip(json.loads(json.dumps(tree_to_dict(t)))) for t in trees]


def test_simulated_tiny_run_records_the_scripted_policys_trees():
    cfg = load_config(["configs/tiny_cpu.yaml"], ["env.num_workers=1"])
    tok = resolve_tokenizer(cfg.model.tokenizer, None)[0]
    tasks = [t for t in load_tasks("val") if t.difficulty in ("easy", "medium")][:3]
    settings = runtime_settings(cfg)

    def oracle():  # fresh each run: the oracle keeps what it sabotaged
        return TextCraftOracle(recipe_book(), tok, max_depth=cfg.env.max_depth, delegate_prob=1.0, fail_prob=0.5)

    async def run(generator):
        factory = make_launcher_factory("execution", cfg.method_config(), "textcraft",
                                        max_context=settings.max_context)
        trees = await run_trees(tasks, "textcraft", generator, tok, settings, max_concurrent=3,
                                rollouts_per_task=2, launcher_factory=factory)
        return await factory.finalize(trees)

    scripted = asyncio.run(run(ScriptedGenerator(tok, oracle())))
    ec = EngineConfig(max_batch=16, num_blocks=4096, max_context=settings.max_context, max_prefill_len=512,
                      max_stop_ids=4)
    engine = SimulatedEngine(cfg.model_config(), None, ec, timer=roofline_timer("h200")(QWEN4B, 2),
                             emission=script_emission(tok, oracle()), tokenizer=tok)
    try:
        simulated = asyncio.run(run(engine))
        stats = engine.stats()
    finally:
        engine.close()
    assert sum(len(t.nodes) for t in scripted) > len(scripted)  # children were delegated, rubrics and scores called
    assert _records(simulated) == _records(scripted)
    # ... and the turns ran through the engine's host path: prefix cache, chunked decode, stop strings learned.
    assert stats["cached_tokens"] > 0 and stats["decode_calls"] > 0 and stats["finished_stop_string"] > 0
    assert stats["simulated_busy_s"] > 0 and stats["compiles"] == 0


def test_a_programs_simulated_time_is_the_roofline_of_its_shapes():
    gpu = TARGETS["h200"]
    timer = roofline_timer("h200")(QWEN4B, 2)
    # A prefill call of 2 rows × 64 tokens: one continues past 32 cached tokens with 40 new, one is padding.
    progs = SimulatedPrograms(timer, [None] * 4, steps=8)
    ctx, new = np.array([32, 0], np.int32), np.array([40, 1], np.int32)
    t0 = time.monotonic()
    _, logits = progs.prefill(None, None, np.zeros((2, 64), np.int32), ctx, new, None, None)
    want = prefill_roofline(QWEN4B, gpu, 128, 40 * 32 + 40 * 39 / 2, 32, 41)
    assert progs.device.busy_s == pytest.approx(want, rel=1e-12)
    np.asarray(logits)  # reading an output waits until the simulated device has computed it
    assert time.monotonic() - t0 >= want
    # A decode chunk of 4 rows (one padding) that stops a row on a stop id at step 3 and one at max_new (step 5).
    state = SimRowState.empty(4, 8)
    state.done[:3], state.len[:3], state.n_gen[:3] = False, [100, 200, 300], 1
    progs.scripts = {0: (np.array([9, 9, 9, 2, 9, 9, 9, 9, 9, 9], np.int32), np.zeros(10, np.float32)),
                     1: (np.arange(10, 20, dtype=np.int32), np.zeros(10, np.float32)),
                     2: (np.arange(20, 40, dtype=np.int32), np.zeros(20, np.float32))}
    rows = {"stop_ids": np.array([[2, -1]] * 4, np.int32), "max_new": np.array([99, 6, 99, 99], np.int32),
            "stop_seqs": np.full((4, 2, 8), -1, np.int32)}
    busy0 = progs.device.busy_s
    _, state, out, _, _, _ = progs.decode(None, None, state, np.array([0, 1, 2, 4]), None,
                                          np.array([True, True, True, False]), rows)
    out = np.asarray(out)
    assert out[0, :3].tolist() == [9, 9, 2] and (out[0, 3:] == -1).all()   # the stop id, included
    assert out[1, :5].tolist() == [11, 12, 13, 14, 15] and (out[1, 5:] == -1).all()   # max_new = 6 with 1 before
    assert out[2].tolist() == list(range(21, 29)) and (out[3] == -1).all()
    assert state.done[:3].tolist() == [True, True, False] and state.n_gen[:3].tolist() == [4, 6, 9]
    counts = [3, 5, 8]
    sums = [sum(c0 + min(s, c) for c0, c in zip((100, 200, 300), counts)) for s in range(8)]
    want = sum(decode_roofline(QWEN4B, gpu, 4, c / 4)[0] for c in sums)
    assert progs.device.busy_s - busy0 == pytest.approx(want, rel=1e-12)
    # At a 4B model's size a step is bound by reading the weights (~8 GB at 4.8 TB/s: ~1.7 ms).
    assert 1.5e-3 < want / 8 < 2.0e-3


def test_unknown_target_gpu_is_a_one_line_error():
    with pytest.raises(ValueError) as e:
        roofline_timer("a100")
    assert str(e.value) == "unknown GPU target 'a100'; shipped: h100, h200"


def test_simulated_engine_bumps_versions_and_never_compiles():
    engine = SimulatedEngine(QWEN4B, None, dataclasses.replace(EngineConfig(), max_batch=4, num_blocks=64),
                             timer=roofline_timer("h100")(QWEN4B, 2),
                             emission=lambda p, s, k: ([5, 6, 7], [-1.0, -1.0, -1.0]))
    try:
        assert engine.load_weights(None) == 1 and engine.warmup() == 0
        from sera_jax.sampling.types import SamplingParams
        r = asyncio.run(engine.generate([1, 2, 3], SamplingParams(max_new_tokens=8, stop_ids=(7,))))
        assert r.token_ids == (5, 6, 7) and r.finish_reason == "stop_id" and r.policy_version == 1
    finally:
        engine.close()
