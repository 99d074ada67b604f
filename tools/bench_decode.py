"""Rollout engine vs transformers ``generate`` on CPU, and the prefix cache on 8 branches of one shared prompt.

Usage: ``python tools/bench_decode.py [--quick] [--only workload|decode|branch]``.

0. The headline, the job's own shapes: the shipped tiny warm start (the tiny default's policy) replaying the agent
   turns of a real evaluation (``tools/data/tiny_eval_turns.json``: per agent, each turn's prompt and completion
   length, from a ``sera-train`` run's 147-task Easy evaluation; mean prompt ~425, completion ~70 tokens), 16 agents
   at a time as that evaluation ran, each turn's prompt extending the last turn's prompt and completion (multi-turn
   prefix reuse), through the engine config evaluation uses; against transformers ``generate`` on the same turns in
   batches of 16 (left-padded, every prompt re-prefilled, each batch generating its longest completion). Each side
   is timed as the best of two passes (fresh token ids each: nothing is cached across passes).

Both sides run the same random Qwen3 weights (written once with ``save_pretrained`` and loaded by transformers'
``Qwen3ForCausalLM``), fp32, greedy, a fixed number of new tokens (no stop), on this machine's CPU cores. The model
is a small Qwen3 (bigger than the test model, so the numbers include real matmul work, not only dispatch overhead);
it is still tiny next to Qwen3-4B, so these ratios say how much per-token overhead the engine removes, not what a
GPU will do (``tools/gpu_decode.sh`` measures that).

1. Decode throughput at batch 1, 8, 32 (prompt 64 tokens, 128 new tokens): tokens/s of each and the ratio.
2. 8 branches from one 2,048-token prompt (as at a delegation point), 32 new tokens each: with the prefix cache
   (the first branch prefills the prompt, the other 7 reuse its blocks) vs without: prefilled tokens and wall time.

Each timed run follows an untimed warm-up of the same shapes (compilation excluded; the workload warms up with
``Engine.warmup()``, every bucketed shape, and reports how many executables that compiled). Ends with a RESULT line.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import os
import tempfile
import time

import jax
import numpy as np

from sera_jax.model import Qwen3Config, init_params, save_pretrained
from sera_jax.profiling.flops import decode_flops
from sera_jax.profiling.machine import matmul_rate
from sera_jax.sampling import Engine, EngineConfig, SamplingParams


def bench_config(quick: bool) -> Qwen3Config:
    """Returns the benchmark model: ~7M parameters (quick: ~2M), GQA 2:1, tied embeddings."""
    if quick:
        return Qwen3Config(vocab_size=2048, hidden_size=128, intermediate_size=384, num_layers=2, num_heads=4,
                           num_kv_heads=2, head_dim=32, rope_theta=10_000.0, max_position_embeddings=4096)
    return Qwen3Config(vocab_size=4096, hidden_size=256, intermediate_size=768, num_layers=4, num_heads=8,
                       num_kv_heads=4, head_dim=32, rope_theta=10_000.0, max_position_embeddings=4096)


def run_engine(engine: Engine, prompts, sp: SamplingParams, keys=None):
    """Returns (results, seconds) of generating all prompts concurrently."""
    async def main():
        return await asyncio.gather(*[engine.generate(p, sp, key=None if keys is None else keys[i])
                                      for i, p in enumerate(prompts)])
    t0 = time.perf_counter()
    res = asyncio.run(main())
    return res, time.perf_counter() - t0


def hf_generate(model, prompts, new_tokens):
    """Returns seconds for transformers' greedy generate of ``new_tokens`` per row (equal-length prompts)."""
    import torch

    ids = torch.as_tensor(np.asarray(prompts), dtype=torch.long)
    t0 = time.perf_counter()
    with torch.no_grad():
        out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=new_tokens,
                             min_new_tokens=new_tokens, do_sample=False, pad_token_id=0)
    dt = time.perf_counter() - t0
    assert out.shape[1] == ids.shape[1] + new_tokens
    return dt, out[:, ids.shape[1]:].numpy()


WORKLOAD = os.path.join(os.path.dirname(os.path.abspath(__file__)), "data", "tiny_eval_turns.json")


def workload_flops(cfg, chains) -> float:
    """Returns the FLOPs the workload needs at the least: every token each turn adds to its agent's history (the
    prompt's new part, all of it after a cut, and the completion but its last token) through the model once at its
    position (``profiling.flops.decode_flops``), without the unembedding for prompt tokens that sample nothing."""
    contexts, silent = [], 0
    for chain in chains:
        prev = 0
        for p, c in chain:
            start = prev if p >= prev else 0
            contexts.extend(range(start, p + c - 1))
            silent += p - start - 1  # prompt tokens before the last one: no logits needed
            prev = p + c
    return decode_flops(cfg, contexts) - 2.0 * cfg.vocab_size * cfg.hidden_size * silent


def bench_workload(num_agents: int) -> str:
    """Replays ``num_agents`` agents' turns (see the module docstring, part 0) on the engine and on transformers;
    prints the table and returns the RESULT fields."""
    import json

    import torch
    import transformers

    from sera_jax.config import load_config
    from sera_jax.assembly.engines import engine_config
    from sera_jax.model import load_pretrained
    from sera_jax.warmstart.sft import SHIPPED_DIR

    data = json.load(open(WORKLOAD))
    chains = data["chains"][:num_agents]
    conc = int(data["concurrency"])
    turns = [t for c in chains for t in c]
    tokens = sum(c for _, c in turns)
    tiny = load_config([os.path.join(os.path.dirname(WORKLOAD), "..", "..", "configs", "tiny_cpu.yaml")])
    model_cfg, params = load_pretrained(SHIPPED_DIR)
    ec = engine_config(tiny, "float32", evaluation=True, model_cfg=model_cfg)
    print(f"workload: {len(chains)} agents, {len(turns)} turns, mean prompt {np.mean([p for p, _ in turns]):.0f}, "
          f"mean completion {np.mean([c for _, c in turns]):.0f} tokens, {conc} agents at a time; the shipped tiny "
          f"warm start ({model_cfg.num_params() / 1e6:.1f}M params, fp32), the evaluation's engine config")

    def replay(engine: Engine, seed: int) -> float:
        rs = np.random.RandomState(seed)  # fresh token ids per replay: nothing is cached across replays
        gate = asyncio.Semaphore(conc)

        async def agent(chain):
            async with gate:
                prev: list[int] = []
                for p, c in chain:
                    prompt = prev + rs.randint(0, model_cfg.vocab_size, p - len(prev)).tolist() if p >= len(prev) \
                        else rs.randint(0, model_cfg.vocab_size, p).tolist()  # a cut history starts afresh
                    res = await engine.generate(prompt, SamplingParams(max_new_tokens=c, temperature=0.0))
                    assert len(res.token_ids) == c
                    prev = prompt + list(res.token_ids)

        async def main():
            await asyncio.gather(*(agent(c) for c in chains))
        t0 = time.perf_counter()
        asyncio.run(main())
        return time.perf_counter() - t0

    engine = Engine(model_cfg, params, ec)
    t0 = time.perf_counter()
    compiled = engine.warmup()  # every bucketed shape, so the timed replay compiles nothing
    warm_s = time.perf_counter() - t0
    c0 = engine.compile_count()
    s0 = engine.stats()
    t_eng = replay(engine, 2)
    s1 = engine.stats()
    t_eng = min(t_eng, replay(engine, 5))  # best of two (fresh tokens each): the CPU may be shared
    late = engine.compile_count() - c0
    engine.close()
    computed = s1["prefill_tokens"] - s0["prefill_tokens"]
    cached = s1["cached_tokens"] - s0["cached_tokens"]
    live = (s1["decode_live_rows"] - s0["decode_live_rows"]) / max(1, s1["decode_calls"] - s0["decode_calls"])

    hf = transformers.AutoModelForCausalLM.from_pretrained(SHIPPED_DIR, dtype=torch.float32).eval()
    rs = np.random.RandomState(3)

    def hf_replay() -> float:
        seconds = 0.0
        with torch.no_grad():
            for i in range(0, len(turns), conc):
                batch = turns[i:i + conc]
                width, new = max(p for p, _ in batch), max(c for _, c in batch)
                ids = torch.zeros((len(batch), width), dtype=torch.long)
                mask = torch.zeros_like(ids)
                for r, (p, _) in enumerate(batch):
                    ids[r, width - p:] = torch.as_tensor(rs.randint(0, model_cfg.vocab_size, p))
                    mask[r, width - p:] = 1
                t0 = time.perf_counter()
                model_out = hf.generate(ids, attention_mask=mask, max_new_tokens=new, min_new_tokens=new,
                                        do_sample=False, pad_token_id=0)
                seconds += time.perf_counter() - t0
                assert model_out.shape[1] == width + new
        return seconds

    t_hf = min(hf_replay(), hf_replay())  # best of two, as the engine
    # transformers' best case, as a peer would benchmark it: full batches of equal lengths (the workload's means).
    mp, mc = int(round(np.mean([p for p, _ in turns]))), int(round(np.mean([c for _, c in turns])))
    t_uni, n_uni = 0.0, 0
    with torch.no_grad():
        for i in range(0, len(turns), conc):
            b = len(turns[i:i + conc])
            ids = torch.as_tensor(rs.randint(0, model_cfg.vocab_size, (b, mp)))
            t0 = time.perf_counter()
            hf.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=mc, min_new_tokens=mc,
                        do_sample=False, pad_token_id=0)
            t_uni += time.perf_counter() - t0
            n_uni += b * mc
    e_tps, h_tps, u_tps = tokens / t_eng, tokens / t_hf, n_uni / t_uni
    print(f"{'':>13} {'seconds':>8} {'completion tok/s':>17}")
    print(f"{'engine':>13} {t_eng:>8.1f} {e_tps:>17.0f}   (prompt tokens computed {computed}, from the prefix cache "
          f"{cached}; {live:.1f} live rows per decode chunk; warm-up compiles {compiled} executables in {warm_s:.0f} s"
          f"{f', {late} more in the timed run' if late else ''})")
    print(f"{'transformers':>13} {t_hf:>8.1f} {h_tps:>17.0f}   (the same turns in batches of {conc}: left-padded, "
          "every prompt re-prefilled, each batch to its longest completion)")
    print(f"{'  equal lengths':>13} {t_uni:>8.1f} {u_tps:>17.0f}   (its best case: full batches of the mean prompt "
          f"{mp} and completion {mc})")
    print(f"  -> engine / transformers on the job's shapes: {e_tps / h_tps:.2f}x; against its best case "
          f"{e_tps / u_tps:.2f}x (the headline)")
    work, rate = workload_flops(model_cfg, chains), matmul_rate(model_cfg)
    floor = work / rate
    print(f"  -> the machine's limit: the turns need {work / 1e9:.0f} GFLOP at the least; at this machine's best fp32 "
          f"matmul rate on the model's shapes ({rate / 1e9:.0f} GFLOP/s) that is {floor:.2f} s, so the engine runs "
          f"at {floor / t_eng:.0%} of it\n")
    return (f"workload_engine_tps={e_tps:.0f} workload_hf_tps={h_tps:.0f} workload_hf_equal_tps={u_tps:.0f} "
            f"workload_ratio={e_tps / u_tps:.2f} workload_ratio_same_turns={e_tps / h_tps:.2f} "
            f"workload_agents={len(chains)} workload_turns={len(turns)} workload_warmup_executables={compiled} "
            f"workload_floor_s={floor:.2f} workload_of_limit={floor / t_eng:.2f}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="smaller model and fewer tokens (a smoke run)")
    ap.add_argument("--only", choices=("workload", "decode", "branch"), default=None, help="run one part")
    ap.add_argument("--agents", type=int, default=None, help="workload: agents replayed (default 64, quick 12)")
    args = ap.parse_args()
    import torch
    import transformers

    torch.set_num_threads(os.cpu_count() or 1)
    headline = ""
    if args.only in (None, "workload"):
        headline = bench_workload(args.agents or (12 if args.quick else 64))
        if args.only == "workload":
            print(f"RESULT {headline} quick={int(args.quick)}")
            return
    cfg = bench_config(args.quick)
    new_tokens = 32 if args.quick else 128
    batches = (1, 8) if args.quick else (1, 8, 32)
    shared_len = 512 if args.quick else 2048
    branch_new = 8 if args.quick else 32
    prompt_len = 64
    reps = 1 if args.quick else 2
    params = jax.tree.map(lambda x: x * 2.0, init_params(jax.random.key(0), cfg))
    print(f"model: Qwen3 vocab={cfg.vocab_size} hidden={cfg.hidden_size} layers={cfg.num_layers} heads={cfg.num_heads}"
          f"/{cfg.num_kv_heads} ({cfg.num_params() / 1e6:.1f}M params, fp32), CPU x{os.cpu_count()}, jax "
          f"{jax.__version__}, torch {torch.__version__}, transformers {transformers.__version__}")
    print("(a small model so the comparison includes matmul work; far from Qwen3-4B, see tools/gpu_decode.sh)")

    with tempfile.TemporaryDirectory() as d:
        save_pretrained(cfg, params, d)
        hf = transformers.AutoModelForCausalLM.from_pretrained(d, dtype=torch.float32).eval()

    # Prefill batches reach the largest decode batch, so a burst of short prompts is admitted in one round (as
    # transformers prefills its whole batch at once) rather than in staggered groups that then decode out of step.
    ec = EngineConfig(max_batch=max(batches), block_size=16, num_blocks=2048, max_context=shared_len + 256,
                      chunk_steps=32, max_prefill_len=shared_len, max_prefill_batch=max(batches),
                      max_prefill_tokens=4 * shared_len, dtype="float32", batch_buckets=batches,
                      prefill_batch_buckets=tuple(sorted({1, 8, max(batches)})),
                      prefill_len_buckets=(16, 64, shared_len),
                      width_buckets=(4, 8, 16, 32))
    rs = np.random.RandomState(0)
    greedy = SamplingParams(max_new_tokens=new_tokens, temperature=0.0)

    rows, ratios = [], {}
    if args.only != "branch":
        engine = Engine(cfg, params, ec)
        t0 = time.perf_counter()
        n = engine.warmup()
        print(f"engine warm-up: {n} executables compiled in {time.perf_counter() - t0:.1f} s (excluded below)")
        print(f"\n{'batch':>5} {'engine tok/s':>13} {'transformers tok/s':>19} {'ratio':>6}   (prompt {prompt_len}, "
              f"{new_tokens} new tokens, greedy)")
        for b in batches:
            warm = rs.randint(0, cfg.vocab_size, (b, prompt_len)).tolist()
            prompts = rs.randint(0, cfg.vocab_size, (b, prompt_len)).tolist()
            run_engine(engine, warm, greedy)
            hf_generate(hf, warm, new_tokens)
            c0 = engine.compile_count()
            # Best of `reps` alternating runs: the CPU may be shared, and the minimum is the least disturbed time.
            t_eng = t_hf = float("inf")
            for _ in range(reps):
                res, t = run_engine(engine, prompts, greedy)
                t_eng = min(t_eng, t)
                t, hf_tokens = hf_generate(hf, prompts, new_tokens)
                t_hf = min(t_hf, t)
            assert engine.compile_count() == c0, "the timed run compiled"
            agree = np.mean([np.mean(np.asarray(r.token_ids) == h) for r, h in zip(res, hf_tokens)])
            e_tps, h_tps = b * new_tokens / t_eng, b * new_tokens / t_hf
            ratios[b] = e_tps / h_tps
            rows.append((b, e_tps, h_tps))
            print(f"{b:>5} {e_tps:>13.0f} {h_tps:>19.0f} {ratios[b]:>5.1f}x   (greedy tokens agree: {agree:.1%})")
        engine.close()

    # --- 8 branches of one shared prompt: time to every branch's first token (the prefill), and to 32 tokens ---
    branch, compiled_in_timed = {}, {}
    if args.only != "decode":
        for caching in (True, False):
            eng = Engine(cfg, params, dataclasses.replace(ec, prefix_caching=caching))
            eng.warmup()
            for max_new in (1, branch_new):
                sp = SamplingParams(max_new_tokens=max_new, temperature=1.0)
                best = None
                for trial in range(1 + reps):  # the first is a warm-up; fresh prompts each time (nothing cached)
                    shared = rs.randint(0, cfg.vocab_size, shared_len).tolist()
                    before = eng.stats()["prefill_tokens"]
                    c0 = eng.compile_count()
                    _, t = run_engine(eng, [shared] * 8, sp, keys=[jax.random.key(i) for i in range(8)])
                    if trial:
                        compiled_in_timed[caching, max_new] = eng.compile_count() - c0
                        n = eng.stats()["prefill_tokens"] - before
                        best = (n, t) if best is None or t < best[1] else best
                branch[caching, max_new] = best
            eng.close()
        assert not any(compiled_in_timed.values()), f"the timed branch runs compiled: {compiled_in_timed}"
        print(f"\n8 branches from one {shared_len}-token prompt (prefilled tokens, best wall time):")
        print(f"{'':>17} {'prefilled':>10} {'1st token':>10} {f'{branch_new} tokens':>10}")
        for caching in (True, False):
            print(f"{'prefix cache ' + ('on' if caching else 'off'):>17} {branch[caching, 1][0]:>10} "
                  f"{branch[caching, 1][1]:>9.2f}s {branch[caching, branch_new][1]:>9.2f}s")
        pc, pn = branch[True, 1][0], branch[False, 1][0]
        ttft = branch[False, 1][1] / branch[True, 1][1]
        total = branch[False, branch_new][1] / branch[True, branch_new][1]
        print(f"  -> {pn / pc:.1f}x fewer prefilled tokens; {ttft:.1f}x faster to the first tokens (the prefill), "
              f"{total:.1f}x faster to {branch_new} tokens (decoding over the shared context is the same work in both)")
    res = headline + " " + " ".join(f"b{b}_engine_tps={e:.0f} b{b}_hf_tps={h:.0f} b{b}_ratio={e / h:.2f}" for b, e, h in rows)
    if branch:
        res += (f" branch8_prefill_ratio={pn / pc:.2f} branch8_ttft_speedup={ttft:.2f} branch8_speedup={total:.2f} "
                f"branch8_prefill_cached={pc} branch8_prefill_uncached={pn}")
    print(f"RESULT {res} quick={int(args.quick)}")

if __name__ == "__main__":
    main()
