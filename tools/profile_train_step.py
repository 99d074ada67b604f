"""Profile one optimizer step of the real trainer: step time, tokens/s, MFU and peak device memory.

Default: the Qwen3-4B-Instruct-2507 shape with random weights on the local accelerator(s) — bf16 compute, fp32
master weights and Adam moments, remat per layer, FSDP over all local devices, CISPO over packed micro-batches
(``rl.batch.pack_datums`` → ``trainer.stack_micro_batches``), the optax chain of docs/design/algorithm.md §6.3. ``--tiny`` runs the
same path with the tiny preset on CPU in seconds (CI runs it through ``tools/gpu_train.sh --tiny``). ``--plan``
prints XLA's memory plan of the step on any backend, without running it.

A thin front end of ``sera_jax.profiling.train`` (``sera-profile`` is the other, which also writes a profiler
trace); the MFU formula is in ``sera_jax.profiling.flops``. Prints a table and ``RESULT key=value ...``.
"""

from __future__ import annotations

import argparse
import dataclasses



def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tiny", action="store_true", help="tiny preset on CPU (CI): same code path, seconds")
    ap.add_argument("--preset", default=None, help="model preset (default qwen3-4b-instruct-2507, tiny with --tiny)")
    ap.add_argument("--row-len", type=int, default=None, help="tokens per packed row (default 4096; tiny 128)")
    ap.add_argument("--rows", type=int, default=None, help="rows per micro-batch (default 2; tiny 4)")
    ap.add_argument("--micro", type=int, default=None, help="micro-batches per optimizer step (default 2)")
    ap.add_argument("--steps", type=int, default=None, help="timed steps after the warm-up (default 5; tiny 2)")
    ap.add_argument("--seq-min", type=int, default=None, help="shortest packed sequence (default row-len/8)")
    ap.add_argument("--dtype", default=None, help="compute dtype (default: the preset's; bfloat16 for 4B)")
    ap.add_argument("--no-remat", action="store_true", help="keep every layer's activations")
    ap.add_argument("--plan", action="store_true",
                    help="compile the step for abstract inputs on any backend and print XLA's memory plan; no run")
    ap.add_argument("--peak-tflops", type=float, default=None, help="per-device peak for MFU (default 989 on GPU)")
    return ap.parse_args(argv)


def main(argv=None) -> dict:
    args = parse_args(argv)
    import jax

    from sera_jax.cli.profile import format_report, result_line
    from sera_jax.profiling.train import TrainShape, plan_memory, profile_train

    # 16,384 positions per step by default: XLA's dense attention keeps [rows, heads, T, T] fp32 scores per layer,
    # and the compiled plan (--plan) of this shape needs ~105 GiB of the H200's 141 (8192-token rows: ~124 GiB).
    shape = TrainShape.tiny() if args.tiny else TrainShape()
    over = {k: v for k, v in (("preset", args.preset), ("row_len", args.row_len), ("rows", args.rows),
                              ("micro", args.micro), ("seq_min", args.seq_min), ("dtype", args.dtype)) if v is not None}
    if args.no_remat:
        over["remat"] = False
    shape = dataclasses.replace(shape, **over)
    steps = args.steps if args.steps is not None else (2 if args.tiny else 5)
    backend = jax.default_backend()
    if args.plan:
        gib = plan_memory(shape)
        print(f"memory plan of one step on {backend}: {shape.preset}, {shape.micro} x {shape.rows} x "
              f"{shape.row_len} positions (single device, state donated)")
        for k in ("argument", "output", "alias", "temp", "total"):
            print(f"{k + ' (GiB)':32s}{gib[k]:>12.2f}")
        result = {"mode": "plan", "backend": backend, "positions": shape.micro * shape.rows * shape.row_len,
                  "args_gib": round(gib["argument"], 2), "temp_gib": round(gib["temp"], 2),
                  "total_gib": round(gib["total"], 2), "compile_s": round(gib["compile_s"], 1)}
        print("RESULT " + " ".join(f"{k}={v}" for k, v in result.items()))
        return result
    if not args.tiny and backend != "gpu":
        raise SystemExit(f"no GPU visible to JAX (backend {backend!r}): install jax[cuda12], or run --tiny on CPU")
    r = profile_train(shape, steps=steps, peak_tflops=args.peak_tflops)
    print(f"model: {shape.preset} ({r['params'] / 1e9:.3f} B params), compute {r['dtype']}, master "
          f"{r['param_dtype']}, remat {r['remat']}; mesh fsdp={r['devices']} on {backend} ({r['device_kind']})")
    print(f"step: {r['micro']} micro-batches x {shape.rows} rows x {shape.row_len} tokens = {r['tokens']} tokens "
          f"({r['sequences']} packed sequences, {r['loss_tokens']} loss tokens); CISPO, AdamW lr 3e-6, clip 1.0")
    print()
    for name, value in format_report(r):
        print(f"{name:32s}{value:>24s}")
    line = result_line(r, "tiny" if args.tiny else "full")
    print(line)
    if r["loss"] != r["loss"] or r["skipped"]:
        raise SystemExit("the profiled step produced a non-finite loss or was skipped")
    return dict(kv.split("=", 1) for kv in line.split()[1:])


if __name__ == "__main__":
    main()
