"""``sera-export``: a run (its directory or its ``checkpoints/``) → a Hugging Face directory, or ``--import`` back."""

from __future__ import annotations

import argparse
import json
import sys

from sera_jax.cli.common import missing_path, no_empty_folder, report_user_error
from sera_jax.config import UserError
from sera_jax.interop.export import export_checkpoint, import_pretrained


def main(argv: list[str] | None = None) -> int:
    """``sera-export RUN_DIR OUT_DIR``: exports a checkpoint; returns the exit status."""
    p = argparse.ArgumentParser(prog="sera-export", description=(
        "Export an orbax run checkpoint to a Hugging Face directory (config.json, safetensors, tokenizer files) "
        "that transformers loads; with --import, turn a HF directory into a version-0 run directory "
        "(model.init_from, sera-eval --checkpoint and sera-serve take it as it is)."))
    p.add_argument("src", help="run directory or its checkpoints/ (or a HF directory with --import)")
    p.add_argument("dst", help="output HF directory (or run directory with --import)")
    p.add_argument("--version", type=int, default=None, help="checkpoint version (default: latest)")
    p.add_argument("--dtype", default="bfloat16", choices=["float32", "bfloat16", "float16"])
    p.add_argument("--tokenizer", default=None, help="tokenizer file or directory to copy (default: the run's)")
    p.add_argument("--import", dest="do_import", action="store_true", help="HF directory → run directory")
    args = p.parse_args(argv)
    missing = missing_path(args.src, "Hugging Face directory" if args.do_import else "run or checkpoint directory")
    if missing is None and args.tokenizer is not None:
        missing = missing_path(args.tokenizer, "tokenizer")
    if missing is not None:
        return report_user_error("sera-export", missing)
    try:
        with no_empty_folder(args.dst):
            if args.do_import:
                path = import_pretrained(args.src, args.dst)
                print(json.dumps({"run": str(path), "checkpoint": str(path / "checkpoints"), "version": 0}))
            else:
                print(json.dumps(export_checkpoint(args.src, args.dst, version=args.version, dtype=args.dtype,
                                                   tokenizer=args.tokenizer), indent=1))
    except UserError as e:
        return report_user_error("sera-export", e)
    return 0


if __name__ == "__main__":
    sys.exit(main())
