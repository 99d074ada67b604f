"""``sera-profile``: N sharded train steps (or engine decode chunks) under jax.profiler, with a report and a trace;
or, with ``--aot CONFIG``, a paper config's whole GPU job compiled for its described GPUs on this (CPU) machine.

Also runnable without the installed script: ``python -m sera_jax.cli.profile ARGS``.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import time
from pathlib import Path
from typing import Any

import jax

from sera_jax.profiling import trace_files
from sera_jax.profiling.decode import DecodeShape, profile_decode
from sera_jax.profiling.train import TrainShape, profile_train

MFU_TRAIN = ("MFU = (6·N·tokens + 6·L·H·E·Σ s²) / step time / (devices × peak); N params, tokens real tokens, "
             "s each packed sequence's length; remat recomputation not counted")
MFU_DECODE = ("MFU = Σ_tokens (2·N + 4·L·H·E·context) / decode time / peak (forward only, one device); "
              "HBM roofline = (weights + K/V of every row) bytes per step / 4.8 TB/s / step time")


def _gib(b: int | None) -> str:
    return f"{b / 2**30:.2f}" if b else "n/a (backend reports no memory stats)"


def format_report(r: dict[str, Any]) -> list[tuple[str, str]]:
    """Returns the report rows (name, value) of a ``profile_train`` or ``profile_decode`` result."""
    mfu = f"{100 * r['mfu']:.1f}%" if r.get("mfu") is not None else "n/a (no peak FLOP/s for this backend)"
    if r["kind"] == "train":
        times = r["times"]
        return [("init + shard state (s)", f"{r['init_s']:.2f}"), ("compile (s)", f"{r['compile_s']:.2f}"),
                ("first step after compile (s)", f"{r['first_step_s']:.4f}"),
                ("step time, median (s)", f"{r['step_s']:.4f}"),
                ("step time, min / max (s)", f"{min(times):.4f} / {max(times):.4f}"),
                ("tokens per step", f"{r['tokens']:,}"), ("tokens/s", f"{r['tok_s']:,.0f}"),
                ("tokens/s per device", f"{r['tok_s'] / r['devices']:,.0f}"),
                ("model TFLOP per step", f"{r['flops'] / 1e12:.4g}"), ("MFU", mfu),
                ("roofline step time, H200 (s)", f"{r['projected_step_s']:.4f}"),
                ("collectives per device (GiB)", f"{r['collective_bytes'] / 2**30:.3f}"),
                ("peak device memory (GiB)", _gib(r["peak_mem_bytes"])),
                ("XLA memory plan (GiB)", f"{r['plan_peak_bytes'] / 2**30:.2f}"),
                ("train state (GiB, all devices)", f"{r['state_bytes'] / 2**30:.2f}"),
                ("loss / grad norm (last step)", f"{r['loss']:.4f} / {r['grad_norm']:.4f}"),
                ("skipped (non-finite)", str(r["skipped"]))]
    roof = f"{100 * r['roofline']:.1f}%" if r.get("roofline") is not None else "n/a (no HBM bandwidth for backend)"
    return [("init weights + engine (s)", f"{r['init_s']:.2f}"), ("compile (warm-up) (s)", f"{r['compile_s']:.2f}"),
            ("prefill-only run (s)", f"{r['prefill_s']:.4f}"), ("decode time (s)", f"{r['decode_s']:.4f}"),
            ("decode chunks per row / dispatched", f"{r['chunks']} / {r['chunks_dispatched']}"),
            ("time per chunk (s)", f"{r['chunk_s']:.4f}"), ("time per decode step (ms)", f"{1e3 * r['step_s']:.3f}"),
            ("decoded tokens", f"{r['tokens']:,}"), ("tokens/s", f"{r['tok_s']:,.0f}"),
            ("model TFLOP (decode)", f"{r['flops'] / 1e12:.4g}"), ("MFU", mfu), ("HBM roofline", roof),
            ("peak device memory (GiB)", _gib(r["peak_mem_bytes"])),
            ("compilations while timed", str(r["new_compiles"]))]


def result_line(r: dict[str, Any], mode: str) -> str:
    """Returns the ``RESULT key=value ...`` line of a profile result."""
    def rnd(x, n):
        return "na" if x is None else round(x, n)

    out = {"kind": r["kind"], "mode": mode, "backend": r["backend"], "devices": r["devices"],
           "params_b": round(r["params"] / 1e9, 4), "compile_s": round(r["compile_s"], 2),
           "step_s": round(r["step_s"], 6), "tokens": r["tokens"], "tok_s": round(r["tok_s"]),
           "mfu": rnd(r.get("mfu"), 4),
           "peak_mem_gib": "na" if not r["peak_mem_bytes"] else round(r["peak_mem_bytes"] / 2**30, 2)}
    if r["kind"] == "train":
        out.update(skipped=r["skipped"], projected_step_s=round(r["projected_step_s"], 6),
                   plan_gib=round(r["plan_peak_bytes"] / 2**30, 2))
    else:
        out.update(chunk_s=round(r["chunk_s"], 6), roofline=rnd(r.get("roofline"), 4),
                   new_compiles=r["new_compiles"])
    out["trace_files"] = r.get("trace_files", 0)
    return "RESULT " + " ".join(f"{k}={v}" for k, v in out.items())


def main(argv: list[str] | None = None) -> int:
    """``sera-profile``: N sharded train steps (or, with ``--decode``, N engine decode chunks) under jax.profiler;
    prints the report and a RESULT line; returns the exit status."""
    p = argparse.ArgumentParser(prog="sera-profile", description=(
        "Profile N sharded train steps (default) or N decode chunks of the rollout engine (--decode) on random "
        "weights, under jax.profiler. The trace goes to OUT/trace (tensorboard --logdir OUT/trace, or load "
        "OUT/trace/plugins/profile/*/perfetto_trace.json.gz in ui.perfetto.dev); the report to stdout and "
        "OUT/report.json."))
    p.add_argument("--tiny", action="store_true", help="tiny preset on CPU, seconds (CI)")
    p.add_argument("--preset", default=None, help="model preset (default qwen3-4b-instruct-2507; tiny with --tiny)")
    p.add_argument("--steps", type=int, default=None, help="train steps (or decode chunks) traced and timed "
                   "(default 5; tiny 2)")
    p.add_argument("--decode", action="store_true", help="profile the engine's decode chunks instead")
    p.add_argument("--out", default=None, help="output directory (default sera_profile/<train|decode>-<UTC time>)")
    p.add_argument("--no-trace", action="store_true", help="time without the profiler (no trace written)")
    p.add_argument("--rows", type=int, default=None, help="train: rows per micro-batch; decode: batch size")
    p.add_argument("--row-len", type=int, default=None, help="train: tokens per packed row")
    p.add_argument("--micro", type=int, default=None, help="train: micro-batches per step")
    p.add_argument("--prompt-len", type=int, default=None, help="decode: prompt tokens per row")
    p.add_argument("--peak-tflops", type=float, default=None, help="per-device peak for MFU (default 989 on GPU)")
    aot = p.add_argument_group("deviceless compile (--aot): needs the aot extra (jax's CUDA plugin, no GPU)")
    aot.add_argument("--aot", action="store_true", help="compile CONFIG's train step, engine, publish and Pallas "
                     "kernels for its mesh of described GPUs; report memory, kernels, collectives, a projection")
    aot.add_argument("config", nargs="*", help="--aot: config files and a.b=c overrides "
                     "(e.g. configs/paper/textcraft_sera.yaml)")
    aot.add_argument("--target", default="h200", help="GPU described (shipped: h200, h100)")
    aot.add_argument("--every-bucket", action="store_true", help="every step row length and engine shape bucket "
                     "(default: the shapes that bound memory; minutes more)")
    aot.add_argument("--mem-fraction", type=float, default=None, help="the allocator's share of device memory "
                     "(default 0.75, JAX's)")
    aot.add_argument("--network-gbps", type=float, default=400.0, help="cross-host bandwidth per GPU, Gbit/s each "
                     "way (default 400: one 400G NIC per GPU)")
    aot.add_argument("--max-traffic-ratio", type=float, default=1.1, help="the step's collective bytes over FSDP's "
                     "minimum above which the check fails (default 1.1)")
    aot.add_argument("--decode-rows", type=int, default=64, help="rows per GPU in the decode roofline (default 64)")
    aot.add_argument("--hosts", default=None, metavar="N,N,...",
                     help="--aot: compile the job again for each host count (mesh.data and mesh.dcn_data = N, the "
                          "config's GPUs per host) and print a scaling table: per-device memory, step collectives "
                          "against FSDP's minimum, projected hours")
    aot.add_argument("--tree", action="append", default=[], metavar="FIELD=VALUE",
                     help="an assumption of the projection's tree (profiling.projection.TreeShape), e.g. agents=4")
    sim = p.add_argument_group("simulated rollout step (--simulate GPU): the host side of one training step")
    sim.add_argument("--simulate", metavar="GPU", default=None, help="run CONFIG's step of task groups on simulated "
                     "GPUs (h200, h100: the roofline's time, the oracle's tokens) and report the host's costs "
                     "(profiling/host_side.py); every figure is labelled simulated")
    sim.add_argument("--stage", default="execution", choices=("execution", "delegation", "rubric_generation"),
                     help="--simulate: the step's stage")
    args = p.parse_args(argv)
    if args.simulate:
        return _simulate_main(args)
    if args.aot:
        return _aot_main(args)
    if args.config:
        p.error(f"unexpected arguments {args.config} (a config is read only with --aot)")
    backend = jax.default_backend()
    if not args.tiny and backend != "gpu":
        print(f"no GPU visible to JAX (backend {backend!r}): install jax[cuda12], or run --tiny on CPU",
              file=sys.stderr)
        return 2
    kind = "decode" if args.decode else "train"
    steps = args.steps if args.steps is not None else (2 if args.tiny else 5)
    out = Path(args.out or f"sera_profile/{kind}-{time.strftime('%Y%m%d-%H%M%S', time.gmtime())}")
    trace_dir = None if args.no_trace else out / "trace"
    if args.decode:
        shape = DecodeShape.tiny() if args.tiny else DecodeShape()
        over = {k: v for k, v in (("preset", args.preset), ("batch", args.rows), ("prompt_len", args.prompt_len))
                if v is not None}
        shape = dataclasses.replace(shape, **over)
        r = profile_decode(shape, chunks=steps, trace_dir=trace_dir, tiny=args.tiny, peak_tflops=args.peak_tflops)
        print(f"decode: {shape.preset} ({r['params'] / 1e9:.3f} B params, {shape.dtype}) on {r['backend']} "
              f"({r['device_kind']}), batch {shape.batch}, prompts {shape.prompt_len} tokens, {steps} chunks x "
              f"{shape.chunk_steps} steps per row, paged KV (block {shape.block_size})")
        formula = MFU_DECODE
    else:
        shape = TrainShape.tiny() if args.tiny else TrainShape()
        over = {k: v for k, v in (("preset", args.preset), ("rows", args.rows), ("row_len", args.row_len),
                                  ("micro", args.micro)) if v is not None}
        shape = dataclasses.replace(shape, **over)
        r = profile_train(shape, steps=steps, trace_dir=trace_dir, peak_tflops=args.peak_tflops)
        print(f"train: {shape.preset} ({r['params'] / 1e9:.3f} B params), compute {r['dtype']}, master "
              f"{r['param_dtype']}, remat {r['remat']}; mesh fsdp={r['devices']} on {r['backend']} "
              f"({r['device_kind']}); {r['micro']} micro-batches x {shape.rows} rows x {shape.row_len} tokens "
              f"({r['sequences']} packed sequences); CISPO, AdamW; {steps} steps")
        formula = MFU_TRAIN
    files = trace_files(trace_dir) if trace_dir is not None else []
    r["trace_files"] = len(files)
    r["trace_dir"] = str(trace_dir) if trace_dir is not None else None
    print()
    for name, value in format_report(r):
        print(f"{name:36s}{value:>24s}")
    print(f"\n{formula}; peak {r['peak_flops'] / 1e12:.0f} TFLOP/s per device" if r.get("peak_flops")
          else f"\n{formula}; no peak for {r['backend']}: MFU n/a")
    if trace_dir is not None:
        print(f"trace: {trace_dir} ({len(files)} files: {', '.join(f.name for f in files)})")
        print(f"  view: tensorboard --logdir {trace_dir}  |  xprof --logdir {trace_dir}  |  ui.perfetto.dev "
              f"← perfetto_trace.json.gz")
    out.mkdir(parents=True, exist_ok=True)
    (out / "report.json").write_text(json.dumps(r, indent=1, default=str) + "\n")
    print(result_line(r, "tiny" if args.tiny else "full"))
    if r["kind"] == "train" and (r["skipped"] or r["loss"] != r["loss"]):
        print("the profiled step produced a non-finite loss or was skipped", file=sys.stderr)
        return 1
    return 0


def _simulate_main(args) -> int:
    """``sera-profile --simulate GPU CONFIG``: prints the simulated step's report and RESULT line; returns 0, or 2
    for a config error."""
    import asyncio

    from sera_jax.assembly.tasks import load_env_tasks
    from sera_jax.assembly.tokenizer import resolve_tokenizer
    from sera_jax.cli.common import load_or_report
    from sera_jax.profiling.host_side import result_line, simulated_step
    from sera_jax.profiling.machine import matmul_rate

    cfg = load_or_report(list(args.config) + ["engine.backend=simulated", f"engine.simulate={args.simulate}"],
                         check_paths=False)
    if cfg is None:
        return 2
    tokenizer = resolve_tokenizer(cfg.model.tokenizer, cfg.model.hf_dir)[0]
    tasks = load_env_tasks(cfg)[0][:cfg.rollout.tasks_per_step]
    figures = asyncio.run(simulated_step(cfg, tasks, tokenizer, stage=args.stage)).figures
    rate = matmul_rate(_tiny_cfg())  # this machine's speed (the tiny model's projection: seconds, not minutes)
    out = Path(args.out or f"sera_profile/simulated-{cfg.name}-{args.simulate}")
    out.mkdir(parents=True, exist_ok=True)
    (out / "report.json").write_text(json.dumps({**figures, "matmul_gflops": rate / 1e9}, indent=1) + "\n")
    print(json.dumps(figures, indent=1))
    print(f"report: {out / 'report.json'}")
    print(result_line([figures], matmul_gflops=round(rate / 1e9, 1)))
    return 0


def _tiny_cfg():
    from sera_jax.model import Qwen3Config

    return Qwen3Config.preset("tiny")


def _aot_main(args) -> int:
    """``sera-profile --aot``: returns 0 when the job compiles, fits and meets the collective bound; 1 when not;
    2 for a config error or a missing plugin."""
    from sera_jax.cli.common import load_or_report
    from sera_jax.profiling.aot import compile_job
    from sera_jax.profiling.aot_report import report_lines, result_line, scaling_lines, to_json
    from sera_jax.profiling.projection import TreeShape
    from sera_jax.profiling.targets import DEFAULT_MEM_FRACTION, MissingCudaPlugin, get_target

    if not args.config:
        print("--aot needs a config, e.g. configs/paper/textcraft_sera.yaml", file=sys.stderr)
        return 2
    cfg = load_or_report(args.config, check_paths=False)
    if cfg is None:
        return 2
    try:
        target = get_target(args.target)
        tree = TreeShape()
        for item in args.tree:
            key, _, value = item.partition("=")
            if key not in {f.name for f in dataclasses.fields(TreeShape)}:
                raise ValueError(f"--tree {item}: TreeShape has no field {key!r}")
            tree = dataclasses.replace(tree, **{key: type(getattr(tree, key))(value)})
        layouts = [cfg] if not args.hosts else _host_layouts(cfg, args.hosts)
        reports = [compile_job(c, target, every_bucket=args.every_bucket, tree=tree, decode_rows=args.decode_rows,
                               mem_fraction=args.mem_fraction or DEFAULT_MEM_FRACTION,
                               network_bytes_per_s=args.network_gbps * 1e9 / 8,
                               max_traffic_ratio=args.max_traffic_ratio,
                               log=lambda m: print(m, file=sys.stderr, flush=True)) for c in layouts]
    except (MissingCudaPlugin, ValueError) as e:
        print(f"sera-profile --aot: {e}", file=sys.stderr)
        return 2
    if args.hosts:  # the same job on several host counts: one table, one report per layout
        print("\n".join(scaling_lines(reports)))
        out = Path(args.out or f"sera_profile/aot-scaling-{cfg.name}-{target.name}")
        data = [to_json(r) for r in reports]
    else:
        print("\n".join(report_lines(reports[0])))
        out = Path(args.out or f"sera_profile/aot-{cfg.name}-{target.name}")
        data = to_json(reports[0])
    out.mkdir(parents=True, exist_ok=True)
    (out / "report.json").write_text(json.dumps(data, indent=1, default=str) + "\n")
    print(f"report: {out / 'report.json'}")
    if not args.hosts:
        print(result_line(reports[0]))
    return 0 if all(r.ok for r in reports) else 1


def _host_layouts(cfg, hosts: str) -> list:
    """Returns ``cfg`` laid over each host count of ``hosts`` ("2,4,8"): mesh.data and mesh.dcn_data scaled, the
    GPUs per host kept. Raises ValueError for a malformed list."""
    try:
        counts = [int(h) for h in hosts.split(",") if h.strip()]
    except ValueError:
        raise ValueError(f"--hosts takes comma-separated host counts, got {hosts!r}") from None
    if not counts or any(h < 1 for h in counts):
        raise ValueError(f"--hosts: host counts must be positive, got {hosts!r}")
    per_host_data = max(1, cfg.mesh.data // max(1, cfg.mesh.dcn_data))
    return [dataclasses.replace(cfg, mesh=dataclasses.replace(cfg.mesh, data=h * per_host_data, dcn_data=h))
            for h in counts]


if __name__ == "__main__":
    sys.exit(main())
