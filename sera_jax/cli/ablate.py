"""``sera-ablate``: methods × seeds of one setting, in sequence, from one warm start, and a Table-1-style report."""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from sera_jax.cli import preemption
from sera_jax.cli.common import (CONFIG_ERROR, DEFAULT_CONFIG, load_or_report, one_process_only, report_user_error,
                                 use_compilation_cache)
from sera_jax.config import UserError, split_cli


def _ints(text: str) -> list[int]:
    return [int(x) for x in text.split(",") if x.strip()]


STAND_IN_NAME = "external-stand-in"   # what the stand-in sera-serve serves under


def start_stand_in(paths: list[str], overrides: list[str], out: str):
    """Starts the external model's stand-in for the rubric-design methods: a ``sera-serve`` of the ablation's frozen
    warm start (built first when missing), and points ``$SERA_EXTERNAL_ENDPOINT`` / ``$SERA_EXTERNAL_MODEL`` at it;
    returns the server process (stopped by the caller)."""
    from sera_jax.config import load_config
    from sera_jax.config.roles import ENDPOINT_ENV, MODEL_ENV
    from sera_jax.serving.process import serve_process
    from sera_jax.warmstart.sft import warm_start

    base = load_config(paths or [str(DEFAULT_CONFIG)], overrides)
    warm_dir = warm_start(base, Path(out).resolve() / "warmstart")
    server = serve_process([str(warm_dir)], "--served-model-name", STAND_IN_NAME, "--max-batch", "16",
                           "--max-context", str(base.rollout.context_tokens),
                           "--max-tokens", str(base.rollout.context_tokens // 2))
    os.environ[ENDPOINT_ENV], os.environ[MODEL_ENV] = server.url + "/v1", STAND_IN_NAME
    print(f"sera-ablate: the external model's stand-in is a sera-serve of the frozen warm start at {server.url}",
          file=sys.stderr)
    return server


def main(argv: list[str] | None = None) -> int:
    """``sera-ablate [CONFIG.yaml ...] [a.b=c ...] [--methods a,b] [--seeds 1,2] [--out DIR]``; returns the exit
    status."""
    from sera_jax.config.roles import ENDPOINT_ENV
    from sera_jax.experiments.ablate import DEFAULT_METHODS, VARIANTS, ablate, needs_endpoint

    p = argparse.ArgumentParser(prog="sera-ablate", description=(
        "Compare methods over seeds on one setting (default: the tiny CPU config): each (method, seed) is a full "
        "run — evaluation, training, evaluation — from one shared warm start, with the base config's number of "
        "updates; finished runs are not rerun. Writes report.md, report.json and comparison.png under --out. "
        f"Methods: {', '.join(VARIANTS)}. The rubric-design methods (kimi_*) ask $SERA_EXTERNAL_ENDPOINT for "
        "$SERA_EXTERNAL_MODEL; unset, a sera-serve of the frozen warm start stands in."))
    p.add_argument("args", nargs="*", help="config files and a.b=c overrides (applied to every run)")
    p.add_argument("--methods", default=",".join(DEFAULT_METHODS), help="comma-separated (default: %(default)s)")
    p.add_argument("--seeds", type=_ints, default=[353, 354, 355], help="comma-separated (default: 353,354,355)")
    p.add_argument("--out", default="runs/ablate", help="output directory (default: %(default)s)")
    args = p.parse_args(argv)
    if not one_process_only("sera-ablate", "its runs and evaluations are sequential one-process jobs"):
        return CONFIG_ERROR
    preemption.install()  # SIGTERM takes Ctrl-C's path: the running run saves, exit 143
    if load_or_report(args.args) is None:
        return CONFIG_ERROR
    methods = [m.strip() for m in args.methods.split(",") if m.strip()]
    bad = [m for m in methods if m not in VARIANTS]
    if bad or not methods or not args.seeds:
        print(f"sera-ablate: give methods from {', '.join(VARIANTS)} and at least one seed (got {bad or methods})",
              file=sys.stderr)
        return 2
    use_compilation_cache()
    paths, overrides = split_cli(list(args.args))
    server = None
    try:
        if needs_endpoint(methods) and not os.environ.get(ENDPOINT_ENV):
            server = start_stand_in(paths, overrides, args.out)
        report = ablate(paths or [str(DEFAULT_CONFIG)], overrides, methods, args.seeds, args.out)
    except KeyboardInterrupt:
        # Each run's loop saved on its way out; finished runs are not rerun.
        print(f"sera-ablate: {preemption.how()}; the same command resumes ({args.out})", file=sys.stderr)
        return preemption.exit_status()
    except UserError as e:
        return report_user_error("sera-ablate", e)
    finally:
        if server is not None:
            server.stop()
    print(open(f"{args.out}/report.md").read())
    runs = sum(len(v) for v in report["runs"].values())
    print(f"RESULT methods={len(methods)} seeds={len(args.seeds)} runs={runs} out={args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
