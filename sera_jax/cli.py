"""Command-line entry points (thin: parse arguments, call the library, print what happened)."""

from __future__ import annotations

import argparse
import json
import sys


def export_main(argv: list[str] | None = None) -> int:
    """``sera-export``: a run checkpoint → a Hugging Face directory (or ``--import`` the reverse)."""
    p = argparse.ArgumentParser(prog="sera-export", description=(
        "Export an orbax run checkpoint to a Hugging Face directory (config.json, safetensors, tokenizer files) "
        "that transformers loads; with --import, turn a HF directory into a version-0 run checkpoint."))
    p.add_argument("src", help="run checkpoint directory (or HF directory with --import)")
    p.add_argument("dst", help="output HF directory (or run checkpoint directory with --import)")
    p.add_argument("--version", type=int, default=None, help="checkpoint version (default: latest)")
    p.add_argument("--dtype", default="bfloat16", choices=["float32", "bfloat16", "float16"])
    p.add_argument("--tokenizer", default=None, help="tokenizer file or directory to copy (default: the run's)")
    p.add_argument("--import", dest="do_import", action="store_true", help="HF directory → run checkpoint")
    args = p.parse_args(argv)
    from sera_jax.export import export_checkpoint, import_pretrained

    if args.do_import:
        path = import_pretrained(args.src, args.dst)
        print(json.dumps({"checkpoint": str(path), "version": 0}))
    else:
        print(json.dumps(export_checkpoint(args.src, args.dst, version=args.version, dtype=args.dtype,
                                           tokenizer=args.tokenizer), indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(export_main())


DEFAULT_CONFIG = "configs/tiny_cpu.yaml"


def _default_config_path() -> str:
    from pathlib import Path

    here = Path(__file__).resolve().parent.parent / DEFAULT_CONFIG
    return str(here)


def train_main(argv: list[str] | None = None) -> int:
    """``sera-train [CONFIG.yaml ...] [a.b=c ...] [--dry-run]``: train (default: the tiny CPU config)."""
    p = argparse.ArgumentParser(prog="sera-train", description=(
        "Train a SERA policy. Arguments are YAML config files (later ones update earlier ones) and a.b=c "
        "overrides; with no file, the tiny CPU default. The run directory (train.out_dir) holds checkpoints, "
        "metrics.jsonl and TensorBoard events; an existing run resumes from its newest checkpoint."))
    p.add_argument("args", nargs="*", help="config files and a.b=c overrides")
    p.add_argument("--dry-run", action="store_true",
                   help="one attempt at each stage of the schedule (rollouts, credit, step) in a fresh directory")
    p.add_argument("--out", default=None, help="run directory (default: train.out_dir)")
    args = p.parse_args(argv)
    import asyncio
    import tempfile

    from sera_jax.config import ConfigError, load_config, split_cli

    paths, overrides = split_cli(args.args)
    try:
        cfg = load_config(paths or [_default_config_path()], overrides, check_paths=True)
    except ConfigError as e:
        print(f"config error: {e}", file=sys.stderr)
        return 2
    from sera_jax.run import build_loop, train_from_config

    def show(o) -> None:
        m = o.metrics
        line = {"version": o.version, "stage": o.stage, "skipped": o.skipped, "reason": o.reason,
                **{k: round(m[k], 6) if isinstance(m.get(k), float) else m.get(k)
                   for k in ("groups_accepted", "groups_started", "trainable_datums", "loss", "grad_norm",
                             "time_rollout_s", "time_train_s") if k in m}}
        print(json.dumps(line), flush=True)

    if args.dry_run:
        async def dry() -> list:
            out = args.out or tempfile.mkdtemp(prefix="sera-dry-run-")
            async with build_loop(cfg, out_dir=out) as loop:
                outcomes = []
                from sera_jax.rl.stages import parse_schedule
                start = 0
                for stage, length in parse_schedule(loop.method.stage_schedule):
                    loop.version = start  # the first version of this stage
                    o = await loop.step()
                    show(o)
                    outcomes.append(o)
                    start += length
                return outcomes
        outcomes = asyncio.run(dry())
        print(json.dumps({"dry_run": "ok", "stages": [o.stage for o in outcomes],
                          "updated": [not o.skipped for o in outcomes]}))
        return 0
    asyncio.run(train_from_config(cfg, out_dir=args.out, on_step=show))
    return 0
