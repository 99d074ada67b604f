"""``sera-profile --aot``: a paper config's whole GPU job compiled for its described GPUs on a CPU machine — the
train step, the engine, the publish and every Pallas kernel — sized against the device's memory, its collectives
held against FSDP's minimum, and its hours projected.

What runs on one GPU at once (everything is colocated: the trainer and an engine share each device, and device 0
also holds a ``policy_frozen`` judge's engine where the method has one):

* during the train step: the step's plan (train state and batch in, state out aliased, temporaries) + the engine's
  resident weights, KV pool and row state + the judge's;
* during the publish: the train state + the publish's plan (the new bf16 replica) + the engine's old weights, pool
  and state + the judge's;
* during rollouts: the train state + the engine's resident buffers and its largest executable's temporaries + the
  judge's.

The largest of the three must fit the allocator's share of the device (``targets.DEFAULT_MEM_FRACTION`` of it, as
JAX's GPU client preallocates); a config that does not is an error that says what to change.
"""

from __future__ import annotations

import dataclasses
from typing import Callable

from sera_jax.assembly.concurrency import groups_in_flight
from sera_jax.assembly.engines import JUDGE_KV_FRACTION, KV_FRACTION, engine_config
from sera_jax.assembly.judge import uses_frozen_judge
from sera_jax.config import ConfigError, RunConfig
from sera_jax.parallel.mesh import make_mesh
from sera_jax.profiling import aot_engine, aot_kernels, aot_step, projection
from sera_jax.profiling.aot_step import CompiledProgram, StepCompile
from sera_jax.profiling.targets import DEFAULT_MEM_FRACTION, GpuTarget, topology_devices
from sera_jax.rl.optim import make_optimizer
from sera_jax.training.step import batch_axis_size

MAX_TRAFFIC_RATIO = 1.1   # collective bytes over FSDP's minimum a compiled step may reach


@dataclasses.dataclass
class AotReport:
    config: str
    target: GpuTarget
    hosts: int
    gpus_per_host: int
    bytes_limit: int
    steps: list[StepCompile]
    engine: aot_engine.EngineCompile
    judge: aot_engine.EngineCompile | None
    publish: CompiledProgram
    kernels: list[aot_kernels.KernelCompile]
    phases: dict[str, dict[str, int]]           # phase -> {part: bytes}
    projection: projection.Projection
    problems: list[str]

    @property
    def peak_phase(self) -> tuple[str, int]:
        name = max(self.phases, key=lambda p: sum(self.phases[p].values()))
        return name, sum(self.phases[name].values())

    @property
    def ok(self) -> bool:
        return not self.problems


def _mesh_layout(cfg: RunConfig) -> tuple[int, int]:
    m = cfg.mesh
    if -1 in (m.data, m.fsdp, m.tensor):
        raise ConfigError("mesh: the deviceless compile needs explicit mesh sizes (no -1)")
    total = m.data * m.fsdp * m.tensor
    hosts = max(1, m.dcn_data)
    if total % hosts:
        raise ConfigError(f"mesh: {total} devices do not split over mesh.dcn_data={hosts} hosts")
    return hosts, total // hosts


def memory_problems(phases: dict[str, dict[str, int]], limit: int, target: GpuTarget, mem_fraction: float,
                    cfg: RunConfig, *, remat: bool) -> list[str]:
    """Returns one message per phase whose colocated bytes exceed ``limit``, naming its largest part and the
    settings that shrink it."""
    out = []
    for name, parts in phases.items():
        total = sum(parts.values())
        if total > limit:
            biggest = max(parts, key=parts.get)
            out.append(
                f"{name}: {total / 2**30:.1f} GiB per device > {limit / 2**30:.1f} GiB ({mem_fraction:.0%} of "
                f"{target.memory_bytes / 2**30:.1f} GiB); largest part: {biggest} {parts[biggest] / 2**30:.1f} GiB. "
                f"Shrink the KV pool (rollout.context_tokens, or assembly.engines.KV_FRACTION = {KV_FRACTION}), the "
                f"micro-batches (batch.token_budget = {cfg.batch.token_budget} tokens per device, batch.buckets), "
                f"or turn on model.remat (now {remat})")
    return out


def compile_job(cfg: RunConfig, target: GpuTarget, *, every_bucket: bool = False, micro: int = 1,
                mem_fraction: float = DEFAULT_MEM_FRACTION, network_bytes_per_s: float = 50e9,
                max_traffic_ratio: float = MAX_TRAFFIC_RATIO,
                tree: projection.TreeShape = projection.TreeShape(), decode_rows: int = 64,
                log: Callable[[str], None] = print) -> AotReport:
    """Returns the report of ``cfg``'s job compiled for ``target`` (see the module docstring). ``every_bucket``:
    every step row length and every engine shape bucket (else the ones that bound memory: the longest rows, the
    largest prefill and decode)."""
    hosts, per_host = _mesh_layout(cfg)
    devices = topology_devices(target, hosts, per_host)
    mesh = make_mesh(cfg.mesh, devices=devices)
    model_cfg = cfg.model_config()
    tx = make_optimizer(cfg.optim)
    limit = target.bytes_limit(mem_fraction)
    problems: list[str] = []

    shapes = aot_step.step_shapes(cfg.batch.token_budget, cfg.batch.buckets, cfg.rollout.context_tokens,
                                  batch_axis_size(mesh))
    # The step's memory follows rows x length per device, nearly constant under the per-device token budget, but
    # not monotone in the length (the shortest bucket has the most rows): without every bucket, both extremes.
    chosen = shapes if every_bucket else sorted({shapes[0], shapes[-1]}, key=lambda s: s[1])
    steps = []
    for rows, t in chosen:
        log(f"compiling the train step [{micro} x {rows} x {t}] for {hosts} x {per_host} {target.name} ...")
        s = aot_step.compile_step(model_cfg, tx, cfg.step, mesh, rows=rows, row_len=t, micro=micro,
                                  devices_per_host=per_host)
        log(f"  {s.program.compile_s:.0f} s; {s.program.gib():.2f} GiB per device; collectives "
            f"{s.traffic / 2**30:.2f} GiB = {s.ratio:.3f}x FSDP's minimum")
        steps.append(s)
        if s.weight_sized:
            problems.append(f"train step [{rows} x {t}]: {len(s.weight_sized)} weight-sized all-reduces within a "
                            f"host (FSDP reduce-scatters gradients there): " + "; ".join(s.weight_sized[:3]))
        if s.ratio > max_traffic_ratio:
            problems.append(f"train step [{rows} x {t}]: collectives {s.ratio:.2f}x FSDP's minimum "
                            f"(> {max_traffic_ratio})")

    engines = cfg.rollout.engines or per_host
    frozen = uses_frozen_judge(cfg)
    kv = KV_FRACTION - (JUDGE_KV_FRACTION if frozen else 0.0)
    ecfg = engine_config(cfg, "bfloat16", engines, kv, backend="gpu", bytes_limit=limit)
    log(f"compiling the engine ({ecfg.max_batch} rows, {ecfg.num_blocks} KV blocks, "
        f"{'every bucket' if every_bucket else 'largest shapes'}) ...")
    engine = aot_engine.compile_engine(model_cfg, ecfg, devices[0], every_bucket=every_bucket)
    log(f"  {len(engine.programs)} executables in {sum(p.compile_s for p in engine.programs):.0f} s")
    judge = None
    if frozen:
        jcfg = engine_config(cfg, "bfloat16", groups_in_flight(cfg), JUDGE_KV_FRACTION, backend="gpu",
                             bytes_limit=limit)
        log("compiling the policy_frozen judge's engine ...")
        judge = aot_engine.compile_engine(model_cfg, jcfg, devices[0], every_bucket=False)
    log("compiling the publish (fp32 FSDP shards -> a bf16 replica per device) ...")
    publish = aot_engine.compile_publish(model_cfg, mesh)

    log("compiling every Pallas kernel at the step's and the engine's shapes ...")
    kernels = []
    split = batch_axis_size(mesh)
    for rows, t in chosen:
        kernels.append(aot_kernels.train_attention_case(model_cfg, max(1, rows // split), t, devices[0]))
    for kind, shape in aot_engine.engine_shapes(ecfg, every_bucket=every_bucket):
        if kind == "prefill":
            b, t, c = shape
            kernels.append(aot_kernels.engine_attention_case(model_cfg, rows=b, new_tokens=t, table_blocks=c,
                                                             num_blocks=ecfg.num_blocks, block_size=ecfg.block_size,
                                                             device=devices[0]))
        elif kind == "decode":
            b, w = shape
            kernels.append(aot_kernels.engine_attention_case(model_cfg, rows=b, new_tokens=1, table_blocks=w,
                                                             num_blocks=ecfg.num_blocks, block_size=ecfg.block_size,
                                                             device=devices[0]))
    for k in kernels:
        if not k.ok:
            problems.append(f"kernel case {k.case}: kernels {k.kernels}, {k.cuda_elfs} CUDA images, "
                            f"sm_90 {'yes' if k.sm90 else 'no'}")

    longest = steps[-1]
    biggest_step = max(steps, key=lambda s: s.program.memory["peak"])
    state_bytes = longest.program.memory["argument"]  # train state + batch: what the step is handed
    resident = engine.resident_bytes + (judge.resident_bytes if judge else 0)
    judge_temp = judge.peak_temp_bytes if judge else 0
    phases = {
        "train step": {"train step (state, batch, temporaries)": biggest_step.program.memory["peak"],
                       "engine weights + KV pool": resident},
        "publish": {"train state": state_bytes, "publish (new bf16 replica, temporaries)":
                    publish.memory["output"] + publish.memory["temp"], "engine weights + KV pool": resident},
        "rollouts": {"train state": state_bytes, "engine weights + KV pool": resident,
                     "engine temporaries (largest executable)": engine.peak_temp_bytes + judge_temp},
    }
    problems += memory_problems(phases, limit, target, mem_fraction, cfg, remat=model_cfg.remat)

    per_micro_within = sum(v["within"] for v in longest.inventory.values()) / micro
    per_micro_across = sum(v["across"] for v in longest.inventory.values()) / micro
    proj = projection.project(model_cfg, target, steps=cfg.train.total_steps,
                              trees_per_step=cfg.rollout.tasks_per_step * cfg.rollout.trees_per_task,
                              gpus=hosts * per_host, within_bytes_per_microbatch=per_micro_within,
                              across_bytes_per_microbatch=per_micro_across, token_budget=cfg.batch.token_budget,
                              network_bytes_per_s=network_bytes_per_s, decode_rows=decode_rows, tree=tree,
                              host=projection.HostCost(), hosts=hosts)
    return AotReport(cfg.name, target, hosts, per_host, limit, steps, engine, judge, publish, kernels, phases, proj,
                     problems)

