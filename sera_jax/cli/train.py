"""``sera-train``: train a SERA policy from a config (default: the embedded tiny CPU run), or ``--dry-run`` it."""

from __future__ import annotations

import argparse
import asyncio
import json
import sys

import jax
from tqdm import tqdm

from sera_jax.cli import preemption, simulate
from sera_jax.cli.common import (CONFIG_ERROR, end_processes, load_or_report, report_user_error, start_processes,
                                 use_compilation_cache)
from sera_jax.config import UserError
from sera_jax.experiments.default_run import run_default
from sera_jax.experiments.dry_run import dry_run
from sera_jax.sampling.simulation import label as simulation_label
from sera_jax.training.build import train_from_config
from sera_jax.training.loop import StepOutcome, StopRequested
from sera_jax.training.resume import finished_version, saved_version

SHOWN = ("groups_accepted", "groups_started", "trainable_datums", "root_success", "delegation_rate",
         "rubric_ranking_auc", "loss", "grad_norm", "infra_failed_trees", "time/rollout_s", "time/train_s")


def step_line(o: StepOutcome) -> str:
    """Returns one attempt's JSON line: version, stage, skip reason and the headline metrics."""
    m = o.metrics
    return json.dumps({"version": o.version, "stage": o.stage, "skipped": o.skipped, "reason": o.reason,
                       **simulation_label(),
                       **{k: round(m[k], 6) if isinstance(m.get(k), float) else m.get(k) for k in SHOWN if k in m}})


def main(argv: list[str] | None = None) -> int:
    """``sera-train [CONFIG.yaml ...] [a.b=c ...] [--dry-run] [--out DIR]``; returns the exit status."""
    p = argparse.ArgumentParser(prog="sera-train", description=(
        "Train a SERA policy. Arguments are YAML config files (later ones update earlier ones) and a.b=c "
        "overrides; with no file, the tiny CPU default. The run directory (train.out_dir) holds checkpoints, "
        "metrics.jsonl and TensorBoard events; an existing run resumes from its newest checkpoint."))
    p.add_argument("args", nargs="*", help="config files and a.b=c overrides")
    p.add_argument("--dry-run", action="store_true",
                   help="one attempt at each stage of the schedule (rollouts, credit, step) in a fresh directory")
    p.add_argument("--out", default=None, help="run directory (default: train.out_dir)")
    p.add_argument("--no-fallback", action="store_true", help=(
        "refuse to resume when the newest checkpoint cannot be read (default: report it and resume from the "
        "newest intact one; train.checkpoint_fallback=false)"))
    simulate.add_argument(p)
    args = p.parse_args(argv)
    if not start_processes("sera-train"):  # a multi-host job's runtime first: nothing may touch the backend before
        return CONFIG_ERROR
    preemption.install()  # SIGTERM (a preemption notice) takes Ctrl-C's path: save, then exit 143
    cfg = load_or_report(args.args + (["train.checkpoint_fallback=false"] if args.no_fallback else [])
                         + simulate.overrides(args))
    if cfg is None:
        return CONFIG_ERROR
    out = args.out or cfg.train.out_dir
    done = None if args.dry_run else finished_version(
        out, cfg.train.total_steps, needs=("summary.json",) if cfg.warmstart.enabled else ())
    if done is not None:
        print(f"sera-train: already at version {done} of {cfg.train.total_steps} in {out}; nothing to do")
        return 0
    use_compilation_cache()
    # A multi-host job's processes agree on every line: process 0 alone prints them.
    speak = jax.process_index() == 0
    if args.dry_run:
        outcomes = asyncio.run(dry_run(cfg, out_dir=args.out,
                                       on_step=lambda o: speak and print(step_line(o), flush=True)))
        if speak:
            print(json.dumps({"dry_run": "ok", "stages": [o.stage for o in outcomes],
                              "updated": [not o.skipped for o in outcomes], "processes": jax.process_count()}))
        end_processes()
        return 0
    # Drawn from the first outcome on (delay): a run stopped before it (a locked directory, a missing path) prints
    # only its one line.
    bar = tqdm(total=cfg.train.total_steps, desc="policy versions", unit="step", dynamic_ncols=True, delay=0.5,
               disable=not speak)

    def progress(o: StepOutcome) -> None:
        if bar.n == 0 and o.version > 0 and not o.skipped:
            bar.update(o.version - 1)  # resumed run: start the bar where the checkpoint left off
        if not o.skipped:
            bar.update(1)
        m = o.metrics
        bar.set_postfix(stage=o.stage, success=round(m.get("root_success", 0.0), 3),
                        loss=round(m.get("loss", float("nan")), 4), skipped=o.skipped)
        if speak:
            with bar.external_write_mode():
                print(step_line(o), flush=True)

    try:
        if cfg.warmstart.enabled:
            asyncio.run(run_default(cfg, out_dir=args.out, on_step=progress, log=lambda m: bar.write(m)))
        else:
            asyncio.run(train_from_config(cfg, out_dir=args.out, on_step=progress))
    except KeyboardInterrupt:
        # The loop saved a checkpoint on the way out (Loop.run), and finished evaluations keep their reports.
        bar.close()
        v = saved_version(out)
        saved = "no version saved yet" if v is None else f"version {v} saved"
        print(f"sera-train: {preemption.how()}; {saved}; the same command resumes ({out} keeps the newest "
              "checkpoint and the finished evaluations)", file=sys.stderr)
        return preemption.exit_status()
    except StopRequested as e:
        # A multi-host job: every process agreed at one step's exchange, saved together and ends here.
        bar.close()
        v = saved_version(out)
        print(f"sera-train: stopped by signal {e.signum} (on process {', '.join(map(str, e.by))}); "
              f"{'no version saved yet' if v is None else f'version {v} saved'}; the same command on every process "
              f"resumes ({out} keeps the newest checkpoint)", file=sys.stderr)
        end_processes()
        return 128 + e.signum
    except UserError as e:
        bar.close()
        return report_user_error("sera-train", e)
    finally:
        bar.close()
    end_processes()
    return 0


if __name__ == "__main__":
    sys.exit(main())
