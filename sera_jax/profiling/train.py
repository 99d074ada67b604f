"""Profile the real sharded train step: compile time, step time, tokens/s, MFU, peak memory, an optional trace.

The step is the trainer's own (``trainer.make_train_step`` over ``shard_train_state``, FSDP over the local
devices), on random weights and synthetic packed datums (``rl.batch.pack_datums`` → ``stack_micro_batches``):
CISPO, the optax chain of docs/design/algorithm.md §6.3 without warm-up, so every step updates. MFU is defined in
``profiling.flops``.
"""

from __future__ import annotations

import dataclasses
import functools
import time
from typing import Any

from sera_jax.model import Qwen3Config, abstract_params, init_params, param_shardings
from sera_jax.parallel import MeshConfig, make_mesh
from sera_jax.parallel.mesh import activate
from sera_jax.parallel.rules import TRAIN_RULES
from sera_jax.profiling import hlo
from sera_jax.profiling.aot_step import memory_of
from sera_jax.profiling.flops import PEAK_FLOPS, peak_memory_bytes, train_flops
from sera_jax.profiling.targets import get_target
from sera_jax.profiling.trace import profiler_trace
from sera_jax.rl.batch import MicroBatch, pack_datums
from sera_jax.rl.datums import Datum
from sera_jax.rl.optim import OptimConfig, make_optimizer
from sera_jax.training.step import (
    batch_axis_size,
    init_train_state,
    make_train_step,
    shard_train_state,
    stack_micro_batches,
    train_step,
)


@dataclasses.dataclass(frozen=True)
class TrainShape:
    """What one profiled step holds: ``micro`` micro-batches of ``rows`` × ``row_len`` tokens."""

    preset: str = "qwen3-4b-instruct-2507"
    row_len: int = 4096
    rows: int = 2
    micro: int = 2
    seq_min: int | None = None  # shortest packed sequence (default row_len / 8)
    dtype: str | None = None  # compute dtype (default: the preset's)
    remat: bool | None = None  # default: the preset's

    @classmethod
    def tiny(cls) -> "TrainShape":
        """Returns the CPU shape CI runs in seconds (the tiny preset)."""
        return cls(preset="tiny", row_len=128, rows=4, micro=2)


def synthetic_datums(cfg, rows: int, row_len: int, seq_min: int, seed: int = 0) -> list:
    """Returns datums that pack into ``rows`` rows filled to 15/16: each row is cut into sequences of ≥ ``seq_min``
    positions (a datum of L tokens fills L − 1), the second half of each sequence trained, advantages
    ±1, behaviour logprobs ≈ an untrained model's (−log V + noise)."""
    import numpy as np

    rng = np.random.default_rng(seed)
    out = []
    for _ in range(rows):
        left = row_len - row_len // 16  # slack: first-fit decreasing re-packs the pieces into the same row count
        while left > 0:
            n = left if left < 2 * seq_min else int(rng.integers(seq_min, min(left - seq_min, row_len // 2) + 1))
            left -= n
            toks = rng.integers(0, cfg.vocab_size, n + 1)
            logp = -np.log(cfg.vocab_size) + rng.normal(0, 0.5, n + 1)
            prompt = (n + 1) // 2
            out.append(Datum(tokens=tuple(int(t) for t in toks), mask=(0,) * prompt + (1,) * (n + 1 - prompt),
                             logprobs=tuple(float(x) for x in logp), versions=(0,) * (n + 1),
                             reward=0.0, advantage=float(rng.choice([-1.0, 1.0])), objective="execution",
                             traj_depth=0, traj_start=1))
    return out


def model_config(shape: TrainShape):
    """Returns the Qwen3 config of the profiled step (fp32 master weights)."""
    over: dict[str, Any] = {}
    if shape.dtype:
        over["dtype"] = shape.dtype
    if shape.remat is not None:
        over["remat"] = shape.remat
    cfg = Qwen3Config.preset(shape.preset, param_dtype="float32", **over)
    return cfg


def plan_memory(shape: TrainShape) -> dict[str, float]:
    """Returns XLA's compiled memory plan (GiB: argument, output, alias, temp, total; and compile_s) of one train
    step on one device of the current backend, for abstract state and batch: nothing is allocated, so a 4B step
    can be planned on a laptop."""
    import jax
    import jax.numpy as jnp

    cfg = model_config(shape)
    tx = make_optimizer(OptimConfig(warmup_steps=0))
    state = jax.eval_shape(lambda p: init_train_state(p, tx), abstract_params(cfg))
    dims = (shape.micro, shape.rows, shape.row_len)
    arr = {k: jax.ShapeDtypeStruct(dims, jnp.int32) for k in ("tokens", "targets", "positions", "segment_ids")}
    arr.update({k: jax.ShapeDtypeStruct(dims, jnp.float32) for k in ("loss_mask", "advantages", "old_logprobs")})
    batch = MicroBatch(**arr, num_tokens=jax.ShapeDtypeStruct((shape.micro,), jnp.int32))
    fn = jax.jit(functools.partial(train_step, model_cfg=cfg, tx=tx), donate_argnums=0)
    t0 = time.perf_counter()
    stats = fn.lower(state, batch).compile().memory_analysis()
    gib = {k: getattr(stats, f"{k}_size_in_bytes") / 2**30 for k in ("argument", "output", "alias", "temp")}
    gib["total"] = gib["argument"] + gib["output"] - gib["alias"] + gib["temp"]
    gib["compile_s"] = time.perf_counter() - t0
    return gib


def profile_train(shape: TrainShape, *, steps: int, trace_dir=None, peak_tflops: float | None = None,
                  seed: int = 0) -> dict[str, Any]:
    """Runs one untimed warm-up step, then ``steps`` timed steps (under ``jax.profiler`` into ``trace_dir`` when
    given, one ``StepTraceAnnotation`` each). Returns a dict: model and batch description, ``compile_s`` (lowering
    + XLA compilation of the step), ``first_step_s``, per-step ``times``, ``step_s`` (median), ``tokens``,
    ``tok_s``, ``flops`` (per step), ``mfu`` (None without a peak for the backend), ``peak_mem_bytes`` (None where
    the backend reports none), ``state_bytes``, last ``loss`` / ``grad_norm`` / ``skipped``."""
    import jax
    import numpy as np

    backend = jax.default_backend()
    cfg = model_config(shape)
    seq_min = shape.seq_min or max(8, shape.row_len // 8)
    devices = jax.local_devices()
    mesh = make_mesh(MeshConfig(data=1, fsdp=len(devices), tensor=1), devices=devices)
    tx = make_optimizer(OptimConfig(warmup_steps=0))  # the paper's lr 3e-6 etc.; no warm-up so every step updates

    t0 = time.perf_counter()

    # Random weights created on device directly in their FSDP layout (a 4B fp32 copy never touches the host).
    # The embedding (tied: also the unembedding) scaled to std 0.02 as in Hugging Face's initialiser, so the random
    # model's token logprobs sit near −log V like the synthetic behaviour logprobs, and CISPO ratios near 1.
    def hf_like_init(key):
        p = init_params(key, cfg)
        return {**p, "embed": {**p["embed"], "embedding": p["embed"]["embedding"] * 0.02}}

    params = jax.jit(hf_like_init, out_shardings=param_shardings(cfg, mesh))(jax.random.key(seed))
    state = shard_train_state(params, tx, cfg, mesh)
    del params
    jax.block_until_ready(state)
    init_s = time.perf_counter() - t0

    datums = synthetic_datums(cfg, shape.rows * shape.micro, shape.row_len, seq_min, seed)
    packed = pack_datums(datums, token_budget=shape.rows * shape.row_len, row_len=shape.row_len)
    # First-fit packing may need a row more than the exact cut it is given: never drop a micro-batch.
    num_micro = max(shape.micro, len(packed.micro_batches))
    host_batch = stack_micro_batches(packed.micro_batches, num=num_micro, row_multiple=batch_axis_size(mesh))
    seq_lengths = [len(d.tokens) - 1 for d in datums]
    tokens = int(np.sum(np.asarray(host_batch.segment_ids) > 0))
    if tokens != sum(seq_lengths):
        raise AssertionError(f"packed {tokens} tokens, datums hold {sum(seq_lengths)}")
    step = make_train_step(cfg, tx, mesh=mesh, state=state)
    batch = jax.device_put(host_batch, step.batch_sharding)

    with activate(mesh, TRAIN_RULES):
        t0 = time.perf_counter()
        compiled = step.jitted.lower(state, batch).compile()
        compile_s = time.perf_counter() - t0
        plan = memory_of(compiled)
        inv = hlo.inventory(hlo.collectives(compiled.as_text(), len(devices), len(devices)))
        t0 = time.perf_counter()
        state, metrics = compiled(state, batch)
        jax.block_until_ready(metrics)
        first_s = time.perf_counter() - t0
        times = []
        with profiler_trace(trace_dir):
            for i in range(steps):
                with jax.profiler.StepTraceAnnotation("train_step", step_num=i):
                    t0 = time.perf_counter()
                    state, metrics = compiled(state, batch)
                    jax.block_until_ready(metrics)
                    times.append(time.perf_counter() - t0)
    step_s = float(np.median(times))
    flops = train_flops(cfg, seq_lengths, loss_tokens=int(packed.num_tokens))
    peak = peak_tflops * 1e12 if peak_tflops else PEAK_FLOPS.get(backend)
    # The roofline projection of this very step on an H200 (what `sera-profile --aot` projects), beside the
    # measurement: FLOPs at the dense bf16 peak, the compiled step's collective bytes at NVLink.
    h200 = get_target("h200")
    within, across = hlo.total_traffic(inv)
    projected_s = max(flops / (len(devices) * (peak or h200.bf16_flops)), (within + across) / h200.nvlink_bytes_per_s)
    return {
        "kind": "train", "backend": backend, "device_kind": devices[0].device_kind, "devices": len(devices),
        "preset": shape.preset, "params": cfg.num_params(), "dtype": str(cfg.dtype),
        "param_dtype": str(cfg.param_dtype), "remat": bool(cfg.remat), "micro": num_micro, "rows": shape.rows,
        "row_len": shape.row_len, "sequences": len(datums), "loss_tokens": int(packed.num_tokens),
        "init_s": init_s, "compile_s": compile_s, "first_step_s": first_s, "times": times, "step_s": step_s,
        "tokens": tokens, "tok_s": tokens / step_s, "flops": flops, "peak_flops": peak,
        "mfu": flops / step_s / (peak * len(devices)) if peak else None,
        "peak_mem_bytes": peak_memory_bytes(devices), "plan_peak_bytes": plan["peak"],
        "collective_bytes": within + across, "projected_step_s": projected_s,
        "state_bytes": sum(x.nbytes for x in jax.tree.leaves(state)),
        "loss": float(metrics["loss"]), "grad_norm": float(metrics["grad_norm"]),
        "skipped": int(float(metrics["skipped"])),
    }
