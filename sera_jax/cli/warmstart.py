"""``sera-warmstart``: build the oracle warm start a config names (TextCraft or TextWorld-Sync)."""

from __future__ import annotations

import argparse
import sys

from sera_jax.cli import preemption
from sera_jax.cli.common import CONFIG_ERROR, load_or_report, one_process_only, report_user_error
from sera_jax.config import UserError
from sera_jax.training.run_lock import RunLock
from sera_jax.warmstart.sft import ship, warm_start


def main(argv: list[str] | None = None) -> int:
    """``sera-warmstart [CONFIG.yaml ...] [a.b=c ...] [--out DIR] [--ship]``; returns the exit status."""
    p = argparse.ArgumentParser(prog="sera-warmstart", description=(
        "Supervised warm start on oracle demonstrations (TextCraft or TextWorld-Sync): the oracle plays the config's tasks through "
        "the runtime (acting, delegating, writing rubrics, scoring children); the policy is fine-tuned on them for "
        "warmstart.steps updates and saved where model.init_from (default: warmstart.out_dir) reads it."))
    p.add_argument("args", nargs="*", help="config files and a.b=c overrides (default: the tiny CPU config)")
    p.add_argument("--out", default=None, help="output run directory (default: model.init_from or warmstart.out_dir)")
    p.add_argument("--ship", action="store_true",
                   help="build from scratch (never copy the shipped one) and rewrite the package's shipped warm start")
    args = p.parse_args(argv)
    if not one_process_only("sera-warmstart", "its supervised warm start is a one-host job"):
        return CONFIG_ERROR
    preemption.install(direct=True)  # SIGTERM: KeyboardInterrupt at once, exit 143 (nothing to save on the way)
    cfg = load_or_report(args.args)
    if cfg is None:
        return CONFIG_ERROR
    target = args.out or cfg.model.init_from or cfg.warmstart.out_dir
    try:
        with RunLock(target):  # one writer per directory (training/run_lock.py)
            out = warm_start(cfg, target, use_shipped=not args.ship)
            if args.ship:
                print(f"shipped warm start written to {ship(cfg, out)}")
    except KeyboardInterrupt:
        print(f"sera-warmstart: {preemption.how()}; the same command starts the warm start again", file=sys.stderr)
        return preemption.exit_status()
    except UserError as e:
        return report_user_error("sera-warmstart", e)
    return 0


if __name__ == "__main__":
    sys.exit(main())
