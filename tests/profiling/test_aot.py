"""The deviceless GPU compile (``sera-profile --aot``): the train step, engine, publish and Pallas kernels compiled for
a described H200 mesh on this CPU machine, at a small model so it takes seconds. The paper-scale run is
``.ci/run``'s (docs/results/gpu_check.md).

Needs jax's CUDA plugin (the ``aot`` extra, which the README's test command installs)."""

from __future__ import annotations

import json
import subprocess
import sys

import jax
import pytest

from sera_jax.profiling import targets

try:
    targets.check_plugin()
except targets.MissingCudaPlugin as e:  # the README's test command installs it; a bare `.[test]` does not
    pytest.skip(f"no CUDA plugin for the deviceless compile: {e}", allow_module_level=True)

from sera_jax.assembly.engines import engine_config
from sera_jax.config import load_config
from sera_jax.model import abstract_params
from sera_jax.parallel.mesh import make_mesh
from sera_jax.profiling import aot, aot_engine, aot_kernels, aot_step, hlo
from sera_jax.rl.optim import make_optimizer

# The paper's TextCraft SERA recipe at a small model: 2 hosts x 4 GPUs, FSDP within a host, data across.
SMALL = ["model.preset=tiny", "model.hf_dir=null", "model.dtype=bfloat16", "mesh.data=2", "mesh.fsdp=4",
         "mesh.dcn_data=2", "rollout.context_tokens=1024", "rollout.max_prompt_tokens=768",
         "rollout.max_completion_tokens=256", "eval.context_tokens=1024", "eval.max_prompt_tokens=768",
         "eval.max_completion_tokens=256", "batch.buckets=256,512,1024", "batch.token_budget=2048"]


@pytest.fixture(scope="module")
def small():
    cfg = load_config(["configs/paper/textcraft_sera.yaml"], SMALL)
    devices = targets.topology_devices(targets.get_target("h200"), 2, 4)
    return cfg, devices, make_mesh(cfg.mesh, devices=devices)


def test_topology_is_host_major_gpus(small):
    _, devices, mesh = small
    assert [d.process_index for d in devices] == [0] * 4 + [1] * 4
    assert devices[0].platform == "gpu" and "H200" in devices[0].device_kind
    assert dict(mesh.shape) == {"data": 2, "fsdp": 4, "tensor": 1}


def test_train_step_reduce_scatters_gradients(small):
    """FSDP's gradient traffic: reduce-scatter within a host, the 1/4 shards all-reduced across hosts, and no
    all-reduce of a whole gradient. (Before the step constrained its gradients to the parameters' layout and the
    loss head ran per device, every gradient — the embedding in fp32 at every step of the head's loop — was
    all-reduced over all 8 devices: here 3 weight-sized all-reduces, no reduce-scatter, 7.5x the minimum.)"""
    cfg, _, mesh = small
    m = cfg.model_config()
    # "Weight-sized": a whole layer matrix or more (the smallest is one layer's k_proj, 64 x 2 x 16); the norm
    # scales are replicated parameters whose gradients are rightly all-reduced (384 elements here).
    smallest = min(x.size // m.num_layers for x in jax.tree.leaves(abstract_params(m)["layers"]) if x.ndim >= 3)
    s = aot_step.compile_step(m, make_optimizer(cfg.optim), cfg.step, mesh, rows=16, row_len=512, micro=2,
                              devices_per_host=4, weight_sized_elements=smallest)
    assert s.weight_sized == [], s.weight_sized
    inv = s.inventory
    assert inv["reduce-scatter"]["within"] > 0 and inv["reduce-scatter"]["across"] == 0
    assert inv["all-reduce"]["within"] < 0.01 * s.traffic  # scalars only
    assert inv["all-reduce"]["across"] > 0                  # the shards, across hosts
    # At this size the embedding (a quarter of the parameters) dominates the excess: its gradient is reduced in
    # fp32 (the lookup's scatter-add accumulates there); at 4B the same step is 1.01x (.ci/run holds it to 1.1x).
    assert 0.8 < s.ratio <= 1.25
    assert s.program.memory["temp"] > 0 and s.triton_kernels > 0  # the Pallas flash kernel is in the program


def test_every_kernel_holds_an_sm90_cubin(small):
    cfg, devices, _ = small
    m = cfg.model_config()
    cases = [aot_kernels.train_attention_case(m, 2, 512, devices[0]),
             aot_kernels.engine_attention_case(m, rows=8, new_tokens=1, table_blocks=64, num_blocks=129,
                                               block_size=16, device=devices[0]),
             aot_kernels.engine_attention_case(m, rows=2, new_tokens=256, table_blocks=64, num_blocks=129,
                                               block_size=16, device=devices[0])]
    names = {n for c in cases for n in c.kernels}
    assert names == {"flash_attention_fwd", "flash_attention_dq", "flash_attention_dkv", "paged_decode_attention"}
    assert all(c.ok and c.cuda_elfs >= len(set(c.kernels)) for c in cases), cases


def test_engine_and_publish_compile_with_their_memory(small):
    cfg, devices, mesh = small
    m = cfg.model_config()
    ecfg = engine_config(cfg, "bfloat16", 4, backend="gpu", bytes_limit=1 << 30)
    e = aot_engine.compile_engine(m, ecfg, devices[0], every_bucket=False)
    assert [p.name.split("[")[0] for p in e.programs] == ["prefill", "start", "decode"]
    kv_per_block = 2 * m.num_layers * m.num_kv_heads * m.head_dim * ecfg.block_size * 2
    assert e.pool_bytes == ecfg.num_blocks * kv_per_block
    assert e.weights_bytes == m.num_params() * 2  # bf16 sampler weights (tied embedding stored once)
    for p in e.programs:  # the pool is donated: prefill and decode update it in place (its output aliases it)
        if not p.name.startswith("start"):
            assert p.memory["alias"] >= e.pool_bytes and p.memory["argument"] >= e.pool_bytes + e.weights_bytes
    pub = aot_engine.compile_publish(m, mesh)
    # A whole bf16 replica on every device (plus the output tuple's table of buffer pointers).
    assert 0 <= pub.memory["output"] - m.num_params() * 2 <= 8 * 64
    colls = hlo.collectives(pub.hlo_text, 8, 4)
    assert colls and all(c.kind == "all-gather" and not c.cross_host for c in colls)  # within a host, bf16


def test_the_cli_compiles_the_job(tmp_path):
    out = subprocess.run([sys.executable, "-m", "sera_jax.cli.profile", "--aot", "configs/paper/textcraft_sera.yaml",
                          *SMALL, "--max-traffic-ratio", "1.25", "--out", str(tmp_path)],
                         capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    assert "4 of 4 compiled with an sm_90 cubin" in out.stdout and ": fits (" in out.stdout
    result = out.stdout.strip().splitlines()[-1]
    assert result.startswith("RESULT ") and "weight_sized_allreduce=0" in result and "ok=1" in result
    report = json.loads((tmp_path / "report.json").read_text())
    assert report["problems"] == []
    assert [(s["rows"], s["row_len"]) for s in report["steps"]] == [(64, 256), (16, 1024)]  # 2048 tokens/device
    peak = max(sum(p.values()) for p in report["phases"].values())
    assert 0 < peak < report["bytes_limit"] and report["projection"]["hours"] > 0


def test_a_job_that_does_not_fit_says_what_to_shrink():
    cfg = load_config(["configs/paper/textcraft_sera.yaml"], SMALL)
    phases = {"train step": {"train step (state, batch, temporaries)": 30 << 30, "engine weights + KV pool": 70 << 30},
              "rollouts": {"train state": 6 << 30, "engine weights + KV pool": 40 << 30}}
    target = targets.get_target("h100")
    (msg,) = aot.memory_problems(phases, target.bytes_limit(), target, 0.75, cfg, remat=True)
    assert msg.startswith("train step: 100.0 GiB per device > 59.7 GiB")
    assert "largest part: engine weights + KV pool 70.0 GiB" in msg and "Shrink the KV pool" in msg
    assert "batch.token_budget = 2048 tokens per device" in msg
    assert aot.memory_problems(phases, 200 << 30, target, 0.75, cfg, remat=True) == []


@pytest.mark.slow
def test_the_cli_compiles_the_job_for_several_host_counts(tmp_path):
    out = subprocess.run([sys.executable, "-m", "sera_jax.cli.profile", "--aot", "configs/paper/textcraft_sera.yaml",
                          *SMALL, "--max-traffic-ratio", "1.25", "--hosts", "1,4", "--out", str(tmp_path)],
                         capture_output=True, text=True, timeout=900)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    rows = [line for line in out.stdout.splitlines() if line.startswith("| ") and " x 4 |" in line]
    assert [r.split("|")[1].strip() for r in rows] == ["1 x 4", "4 x 4"]
    reports = json.loads((tmp_path / "report.json").read_text())
    assert [(r["hosts"], r["gpus_per_host"]) for r in reports] == [(1, 4), (4, 4)]
    one, four = (r["steps"][-1]["inventory"] for r in reports)
    assert sum(v["across"] for v in one.values()) == 0  # one host: nothing crosses hosts
    assert sum(v["across"] for v in four.values()) > 0  # four hosts: the data-parallel reduction does
    assert all(r["problems"] == [] for r in reports)


def test_the_serving_engine_with_top_logprobs_compiles_for_the_gpu(small):
    """``sera-serve``'s engine on a GPU: its sizes (``serving.server.engine_config``, bfloat16) with 5 top logprobs
    computed beside each token compile at their largest buckets, and the decode and first-token programs return
    the top-k arrays ([rows, steps, 5], [rows, 5])."""
    from sera_jax.serving.server import ServeOptions
    from sera_jax.serving.server import engine_config as serve_engine_config

    cfg, devices, _ = small
    m = cfg.model_config()
    ecfg = serve_engine_config(m, ServeOptions(max_batch=8, max_context=1024, num_blocks=513), backend="gpu")
    assert ecfg.top_logprobs == 5 and ecfg.dtype == "bfloat16"
    e = aot_engine.compile_engine(m, ecfg, devices[0], every_bucket=False, keep_executables=True)
    kinds = {p.name.split("[")[0]: p for p in e.programs}
    assert set(kinds) == {"prefill", "start", "decode"}
    out = {k: [tuple(o.shape) for o in jax.tree.leaves(p.executable.out_info)] for k, p in kinds.items()}
    assert (ecfg.buckets()["batch"][-1], ecfg.chunk_steps, 5) in out["decode"]
    start_rows = json.loads(kinds["start"].name[len("start"):])[0]
    assert (start_rows, 5) in out["start"]
