"""``sera-profile --aot``'s report: memory per device and per phase against the device, kernels K of K, the step's
collectives against FSDP's minimum, the projection beside the paper's hours; as text, a RESULT line and JSON."""

from __future__ import annotations

from typing import Any

from sera_jax.profiling import hlo
from sera_jax.profiling.aot import AotReport

PAPER_SERA_HOURS = 24 + 14 / 60   # the paper's SERA wall time on 2 × 8 H200 (docs/design/README.md)
GIB = 2**30


def _g(b: float) -> str:
    return f"{b / GIB:.2f}"


def kernel_summary(r: AotReport) -> tuple[int, int, list[str]]:
    """Returns (kernels whose every call site compiled with an sm_90 cubin, kernels seen, their names)."""
    seen: dict[str, bool] = {}
    for k in r.kernels:
        for name in k.kernels:
            seen[name] = seen.get(name, True) and k.ok
    return sum(seen.values()), len(seen), sorted(seen)


def report_lines(r: AotReport) -> list[str]:
    """Returns the human-readable report."""
    t = r.target
    out = [f"{r.config}: compiled for {r.hosts} hosts x {r.gpus_per_host} {t.name} (sera_jax/profiling/targets/"
           f"{t.proto_file}) on this CPU machine; nothing ran on a GPU.", ""]
    out.append(f"Memory per device, GiB (limit {_g(r.bytes_limit)} = the allocator's share of {_g(t.memory_bytes)})")
    for s in r.steps:
        m = s.program.memory
        out.append(f"  train step [{s.micro} x {s.rows} x {s.row_len}]".ljust(48)
                   + f"{_g(m['peak']):>8}  (state + batch {_g(m['argument'])}, temporaries {_g(m['temp'])}; "
                   f"compiled in {s.program.compile_s:.0f} s)")
    e = r.engine
    big = max(e.programs, key=lambda p: p.memory["temp"])
    out.append("  engine, resident".ljust(48) + f"{_g(e.resident_bytes):>8}  (weights {_g(e.weights_bytes)}, KV pool "
               f"{_g(e.pool_bytes)} = {e.config.num_blocks} blocks of {e.config.block_size}, {e.config.max_batch} "
               f"rows)")
    out.append(f"  engine, largest temporaries ({big.name})".ljust(48) + f"{_g(big.memory['temp']):>8}  "
               f"({len(e.programs)} executables, {sum(p.compile_s for p in e.programs):.0f} s)")
    out.append("  publish (new bf16 replica + temporaries)".ljust(48)
               + f"{_g(r.publish.memory['output'] + r.publish.memory['temp']):>8}")
    if r.judge is not None:
        out.append("  policy_frozen judge, resident".ljust(48) + f"{_g(r.judge.resident_bytes):>8}")
    else:
        out.append("  policy_frozen judge".ljust(48) + f"{'none':>8}  (no frozen copy in this method / judge)")
    out.append("  colocated on one GPU, by phase:")
    for name, parts in r.phases.items():
        out.append(f"    {name}".ljust(48) + f"{_g(sum(parts.values())):>8}  ("
                   + ", ".join(f"{k} {_g(v)}" for k, v in parts.items()) + ")")
    phase, peak = r.peak_phase
    verdict = "fits" if peak <= r.bytes_limit else "DOES NOT FIT"
    out.append(f"  peak: {_g(peak)} GiB in the {phase} phase, of {_g(r.bytes_limit)}: {verdict} "
               f"({_g(r.bytes_limit - peak)} GiB to spare)")
    ok, seen, names = kernel_summary(r)
    out += ["", f"Pallas kernels: {ok} of {seen} compiled with an sm_90 cubin ({', '.join(names)}), over "
                f"{len(r.kernels)} call sites:"]
    for k in r.kernels:
        out.append(f"  {k.case}".ljust(56) + f"{'+'.join(k.kernels):<58} {k.cuda_elfs} CUDA images, "
                   f"sm_90 {'yes' if k.sm90 else 'NO'}, {k.compile_s:.1f} s")
    s = r.steps[-1]
    out += ["", f"Train step collectives [{s.micro} x {s.rows} x {s.row_len}], GiB per device per step (ring "
                "traffic) against FSDP's minimum:",
            "  kind".ljust(22) + "within host".rjust(13) + "across hosts".rjust(14) + "executions".rjust(12)
            + "minimum within".rjust(16) + "minimum across".rjust(16)]
    for kind in hlo.KINDS:
        v, mn = s.inventory[kind], s.minimum.get(kind, {})
        out.append(f"  {kind}".ljust(22) + f"{_g(v['within']):>13}{_g(v['across']):>14}{int(v['count']):>12}"
                   + f"{_g(mn.get('within', 0)):>16}{_g(mn.get('across', 0)):>16}")
    out.append(f"  total {_g(s.traffic)} GiB vs FSDP's minimum {_g(s.traffic / s.ratio)}: {s.ratio:.3f}x; "
               f"weight-sized all-reduces within a host: {len(s.weight_sized)}")
    p = r.projection
    tr = p.tree
    ov, serial = p.train_s
    out += ["", "Projection of the run (a projection from peaks and assumptions, not a measurement):",
            f"  assumed tree: {tr.agents:g} agents x {tr.turns_per_agent:g} turns, {tr.completion_tokens} generated + "
            f"{tr.observation_tokens} observed tokens a turn, {tr.system_tokens}-token instructions, "
            f"{tr.sequential_agents:g} agents on the longest chain",
            f"  train step: {p.train_tokens:,.0f} tokens, {p.train_flops / 1e15:.1f} PFLOP -> "
            f"{p.train_compute_s:.1f} s at {t.bf16_flops / 1e12:.0f} TFLOP/s x {p.gpus}; NVLink {p.nvlink_s:.2f} s; "
            f"network {p.network_s:.2f} s; {ov:.1f}-{serial:.1f} s",
            f"  decode at {p.decode_rows} rows per GPU: {1e3 * p.decode_step_s:.1f} ms a step (weights + K/V at "
            f"{t.hbm_bytes_per_s / 1e12:.1f} TB/s) = {p.decode_tok_s_per_gpu:,.0f} tokens/s per GPU",
            f"  rollouts per step: throughput floor {p.rollout_throughput_s:.1f} s, latency floor "
            f"{p.rollout_latency_s:.1f} s",
            *([f"  host-bound: {p.host_s:.1f} s a step ({p.host.in_process_us / 1e3:.1f} ms a call in one process's "
               f"GIL + {p.host.worker_us / 1e3:.1f} ms in workers, {p.host.cores_per_host} cores a host; measured on "
               f"the simulated paper step, docs/results/host_side.md); without the host "
               f"{p.device_hours:.1f} h"] if p.host is not None else []),
            f"  {p.steps} steps x {p.step_s:.1f} s = {p.hours:.1f} h on {p.gpus} {t.name}, beside the paper's "
            f"{PAPER_SERA_HOURS:.1f} h for SERA on 2 x 8 H200 (a floor: the paper's time includes everything the "
            f"roofline leaves out: env steps, sandboxes, judges, imperfect batching)"]
    if r.problems:
        out += ["", "PROBLEMS:"] + [f"  - {x}" for x in r.problems]
    return out


def scaling_lines(reports: list[AotReport]) -> list[str]:
    """Returns a table of the same job compiled for several host counts: per-device peak memory against the limit,
    the train step's collective GiB per device per step (within / across hosts) against FSDP's minimum, and the
    projected hours."""
    out = ["| hosts x GPUs | per-device peak GiB (limit) | fits | step collectives GiB/device: within + across "
           "| FSDP minimum | ratio | projected h |", "|---|---|---|---|---|---|---|"]
    for r in reports:
        s = r.steps[-1]
        within = sum(v["within"] for v in s.inventory.values())
        across = sum(v["across"] for v in s.inventory.values())
        _, peak = r.peak_phase
        out.append(f"| {r.hosts} x {r.gpus_per_host} | {peak / GIB:.1f} ({r.bytes_limit / GIB:.1f}) | "
                   f"{'yes' if peak <= r.bytes_limit else 'NO'} | {_g(within)} + {_g(across)} | "
                   f"{_g(s.traffic / s.ratio)} | {s.ratio:.3f} | {r.projection.hours:.1f} |")
    return out


def result_line(r: AotReport) -> str:
    """Returns the ``RESULT key=value ...`` line."""
    ok, seen, _ = kernel_summary(r)
    s = r.steps[-1]
    phase, peak = r.peak_phase
    fields: dict[str, Any] = {
        "config": r.config, "target": r.target.name, "gpus": r.hosts * r.gpus_per_host,
        "step_gib": round(s.program.gib(), 2), "engine_gib": round(r.engine.resident_bytes / GIB, 2),
        "publish_gib": round((r.publish.memory["output"] + r.publish.memory["temp"]) / GIB, 2),
        "peak_gib": round(peak / GIB, 2), "limit_gib": round(r.bytes_limit / GIB, 2),
        "fits": int(peak <= r.bytes_limit), "kernels_ok": f"{ok}/{seen}",
        "traffic_ratio": round(s.ratio, 3), "weight_sized_allreduce": len(s.weight_sized),
        "projected_h": round(r.projection.hours, 2), "device_h": round(r.projection.device_hours, 2),
        "host_step_s": round(r.projection.host_s, 2), "paper_h": round(PAPER_SERA_HOURS, 2),
        "ok": int(r.ok)}
    return "RESULT " + " ".join(f"{k}={v}" for k, v in fields.items())


def to_json(r: AotReport) -> dict[str, Any]:
    """Returns the report as plain data (report.json)."""
    s = r.steps
    return {
        "config": r.config, "target": r.target.name, "hosts": r.hosts, "gpus_per_host": r.gpus_per_host,
        "bytes_limit": r.bytes_limit,
        "steps": [{"micro": x.micro, "rows": x.rows, "row_len": x.row_len, "memory": x.program.memory,
                   "compile_s": x.program.compile_s, "inventory": x.inventory, "minimum": x.minimum,
                   "ratio": x.ratio, "weight_sized": x.weight_sized} for x in s],
        "engine": {"config": repr(r.engine.config), "weights_bytes": r.engine.weights_bytes,
                   "pool_bytes": r.engine.pool_bytes,
                   "programs": [{"name": p.name, "memory": p.memory, "compile_s": p.compile_s}
                                for p in r.engine.programs]},
        "judge": None if r.judge is None else {"resident_bytes": r.judge.resident_bytes},
        "publish": {"memory": r.publish.memory, "compile_s": r.publish.compile_s},
        "kernels": [{"case": k.case, "kernels": list(k.kernels), "cuda_elfs": k.cuda_elfs, "sm90": k.sm90,
                     "compile_s": k.compile_s} for k in r.kernels],
        "phases": r.phases, "projection": {"hours": r.projection.hours, "step_s": r.projection.step_s,
                                           "device_hours": r.projection.device_hours,
                                           "host_step_s": r.projection.host_s,
                                           "paper_hours": PAPER_SERA_HOURS},
        "problems": r.problems,
    }
