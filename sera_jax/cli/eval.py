"""``sera-eval``: the paper's evaluation protocol on a task set, for a run, a HF directory or the tiny default."""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from pathlib import Path

from sera_jax.agents.efficiency import efficiency_line
from sera_jax.cli.common import (CONFIG_ERROR, end_processes, load_or_report, missing_path, no_empty_folder,
                                 report_user_error, start_processes, use_compilation_cache)
from sera_jax.config import UserError
from sera_jax.evaluation.protocol import evaluate


def main(argv: list[str] | None = None) -> int:
    """``sera-eval [CONFIG.yaml ...] [a.b=c ...] [--checkpoint DIR | --hf DIR] [--tasks N] [--runs R] [--out DIR]``:
    prints the Markdown table and a ``RESULT`` line; returns the exit status."""
    p = argparse.ArgumentParser(prog="sera-eval", description=(
        "Evaluate a policy the way the paper does: one greedy tree per task of eval.task_set, eval caps and step "
        "limit, a failed rollout retried eval.retries times then counted as a failure, success per difficulty and "
        "overall (task-weighted), mean ± sample std over runs, optional test-time selection (eval.best_of_n). "
        "Writes report.json, report.md and trees.jsonl. Default config: the tiny CPU one."))
    p.add_argument("args", nargs="*", help="config files and a.b=c overrides")
    src = p.add_mutually_exclusive_group()
    src.add_argument("--checkpoint", default=None, help="run directory or its checkpoints/ (latest version)")
    src.add_argument("--hf", default=None, help="Hugging Face directory (config.json, safetensors, tokenizer)")
    p.add_argument("--version", type=int, default=None, help="checkpoint version (default: latest)")
    p.add_argument("--tasks", type=int, default=None, help="evaluate N tasks, round-robin over difficulties")
    p.add_argument("--runs", type=int, default=None, help="number of runs (default: eval.num_runs)")
    p.add_argument("--out", default=None, help="output directory (default: <train.out_dir>/eval)")
    p.add_argument("--no-fallback", action="store_true", help=(
        "refuse when the newest checkpoint cannot be read (default: report it and evaluate the newest intact one)"))
    args = p.parse_args(argv)
    if not start_processes("sera-eval"):  # a multi-host job splits the task set over its processes
        return CONFIG_ERROR
    # The policy given on the command line replaces the config's model: its model.hf_dir need not exist.
    cfg = load_or_report(args.args + (["train.checkpoint_fallback=false"] if args.no_fallback else []),
                         check_paths=args.checkpoint is None and args.hf is None)
    if cfg is None:
        return CONFIG_ERROR
    use_compilation_cache()
    if (args.tasks is not None and args.tasks <= 0) or (args.runs is not None and args.runs <= 0):
        return report_user_error("sera-eval", UserError("--tasks and --runs must be positive"))
    if args.version is not None and args.checkpoint is None:
        return report_user_error("sera-eval", UserError("--version needs --checkpoint"))
    for path, what in ((args.checkpoint, "run or checkpoint directory"), (args.hf, "Hugging Face directory")):
        if path is not None and missing_path(path, what):
            return report_user_error("sera-eval", missing_path(path, what))
    out = args.out or str(Path(cfg.train.out_dir) / "eval")

    import jax

    speak = jax.process_index() == 0  # a multi-host job's report is gathered: process 0 alone prints it

    def show(r: int, table: dict) -> None:
        if speak:
            print(json.dumps({"run": r, **{k: round(v["rate"], 4) for k, v in table.items()}}), flush=True)

    try:
        with no_empty_folder(out):
            rep = asyncio.run(evaluate(cfg, out_dir=out, checkpoint=args.checkpoint, hf_dir=args.hf,
                                       num_tasks=args.tasks if args.tasks is not None else cfg.eval.num_tasks,
                                       num_runs=args.runs, on_run=show, version=args.version, progress=speak))
    except UserError as e:
        return report_user_error("sera-eval", e)
    end_processes()
    if not speak:
        return 0
    print(rep["markdown"])
    if rep.get("warmup"):
        print(f"engine warm-up: {rep['warmup']['executables']} executables in {rep['warmup']['seconds']:.1f} s")
    for i, eff in enumerate(rep.get("efficiency") or []):
        print(f"run {i + 1}: {efficiency_line(eff)}")
    m, s = rep["mean_std"]["overall"]
    errored = sum(t["overall"]["errored"] for t in rep["runs"])
    print(f"RESULT env={rep['env']} tasks={rep['num_tasks']} runs={rep['num_runs']} success_mean={m:.4f} "
          f"success_std={s:.4f} errored={errored} out={out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
