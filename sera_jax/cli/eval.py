"""``sera-eval``: the paper's evaluation protocol on a task set, for a run, a HF directory, the tiny default or a
served model, as a pass that survives a kill and splits into shards."""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from pathlib import Path

from sera_jax.cli import preemption, simulate
from sera_jax.cli.common import (CONFIG_ERROR, end_processes, load_or_report, missing_path, no_empty_folder,
                                 report_user_error, start_processes, use_compilation_cache)
from sera_jax.config import UserError

INCOMPLETE = 1  # the pass ran to its end, but some trees errored (their retries spent): the same command retries them


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="sera-eval", description=(
        "Evaluate a policy the way the paper does: one greedy tree per task of eval.task_set, eval caps and step "
        "limit, a failed rollout retried eval.retries times then counted as a failure, success per difficulty and "
        "overall (task-weighted), mean ± sample std over runs, optional test-time selection (eval.best_of_n). "
        "Writes report.json, report.md and trees.jsonl; every finished tree is saved as it ends, and the same "
        "command finishes a killed pass. Default config: the tiny CPU one."), epilog=(
        "Exit status: 0 a complete report; 1 a report with errored trees (counted as failures; the same command "
        "retries them); 2 bad input (one error line); 143 stopped by SIGTERM (what finished is saved)."))
    p.add_argument("args", nargs="*", help="config files and a.b=c overrides")
    src = p.add_mutually_exclusive_group()
    src.add_argument("--checkpoint", default=None, help="run directory or its checkpoints/ (latest version)")
    src.add_argument("--hf", default=None, help="Hugging Face directory (config.json, safetensors, tokenizer)")
    src.add_argument("--endpoint", action="append", default=None, metavar="URL", help=(
        "an OpenAI-compatible server of the policy (repeat for replicas: requests go round-robin); its key is read "
        "from the variable endpoint.api_key_env names (SERA_ENDPOINT_API_KEY)"))
    p.add_argument("--model", default=None, help="the served model's name (with --endpoint)")
    p.add_argument("--tokenizer", default=None, help=(
        "the served model's tokenizer (HF directory, tokenizer.json or .model); a sera-serve sends its own"))
    p.add_argument("--version", type=int, default=None, help="checkpoint version (default: latest)")
    p.add_argument("--tasks", type=int, default=None, help="evaluate N tasks, round-robin over difficulties")
    p.add_argument("--runs", type=int, default=None, help="number of runs (default: eval.num_runs)")
    p.add_argument("--out", default=None, help="output directory (default: <train.out_dir>/eval)")
    p.add_argument("--num-shards", type=int, default=1, help="split the task set into N shards (one per machine)")
    p.add_argument("--shard-index", type=int, default=0, help="which shard this command runs, in [0, N)")
    p.add_argument("--status", metavar="DIR", default=None, help="print done / errored / total per difficulty")
    p.add_argument("--aggregate", metavar="DIR", default=None,
                   help="write the report of a sharded pass once every shard is complete")
    p.add_argument("--no-fallback", action="store_true", help=(
        "refuse when the newest checkpoint cannot be read (default: report it and evaluate the newest intact one)"))
    simulate.add_argument(p)
    return p


def _print_report(rep: dict, out: str) -> int:
    sim = simulate.label()
    if sim:
        print(f"(simulated: the engine ran on a simulated {sim['simulated']}; its device times are the roofline's)")
    print(rep["markdown"])
    if rep.get("warmup"):
        print(f"engine warm-up: {rep['warmup']['executables']} executables in {rep['warmup']['seconds']:.1f} s")
    from sera_jax.agents.efficiency import efficiency_line

    for eff in rep.get("efficiency") or []:
        print(f"run {eff['run'] + 1}" + (f" (shard {eff['shard']})" if rep.get("shards", 1) > 1 else "")
              + f": {efficiency_line(eff)}")
    m, s = rep["mean_std"]["overall"]
    errored = sum(t["overall"]["errored"] for t in rep["runs"])
    print(f"RESULT env={rep['env']} tasks={rep['num_tasks']} runs={rep['num_runs']} success_mean={m:.4f} "
          f"success_std={s:.4f} errored={errored} out={out}{simulate.result_fields()}")
    if errored:
        print(f"sera-eval: incomplete: {errored} tree(s) errored (counted as failures in this report); the same "
              "command retries them", file=sys.stderr)
    return INCOMPLETE if errored else 0


def main(argv: list[str] | None = None) -> int:
    """``sera-eval [CONFIG.yaml ...] [a.b=c ...] [--checkpoint DIR | --hf DIR | --endpoint URL --model NAME]
    [--tasks N] [--runs R] [--out DIR] [--num-shards N --shard-index I]``, ``sera-eval --status DIR``,
    ``sera-eval --aggregate DIR``: prints the Markdown table and a ``RESULT`` line; returns the exit status."""
    args = _parser().parse_args(argv)
    if args.status is not None or args.aggregate is not None:
        return _read_only(args)
    if not start_processes("sera-eval"):  # a multi-host job splits the task set over its processes
        return CONFIG_ERROR
    preemption.install()  # SIGTERM: what is finished is on disk already; exit 143
    overrides = list(args.args) + (["train.checkpoint_fallback=false"] if args.no_fallback else [])
    if args.endpoint:
        if any("," in u for u in args.endpoint):
            return report_user_error("sera-eval", UserError("--endpoint: one URL per flag, without commas"))
        overrides += [f"endpoint.urls={','.join(args.endpoint)}"]
    if args.model is not None:
        overrides += [f"endpoint.model={args.model}"]
    # The policy given on the command line replaces the config's model: its model.hf_dir need not exist.
    overrides += simulate.overrides(args)
    cfg = load_or_report(overrides, check_paths=args.checkpoint is None and args.hf is None and not args.endpoint)
    if cfg is None:
        return CONFIG_ERROR
    problem = None
    if (args.tasks is not None and args.tasks <= 0) or (args.runs is not None and args.runs <= 0):
        problem = UserError("--tasks and --runs must be positive")
    elif args.version is not None and args.checkpoint is None:
        problem = UserError("--version needs --checkpoint")
    elif cfg.endpoint.urls and not cfg.endpoint.model:
        problem = UserError("--endpoint needs --model NAME, the model the server serves")
    elif args.model is not None and not cfg.endpoint.urls:
        problem = UserError("--model names a served model: give --endpoint URL too")
    elif args.num_shards < 1 or not 0 <= args.shard_index < args.num_shards:
        problem = UserError(f"--shard-index must lie in [0, --num-shards); got {args.shard_index} of "
                            f"{args.num_shards}")
    if problem is not None:
        return report_user_error("sera-eval", problem)
    for path, what in ((args.checkpoint, "run or checkpoint directory"), (args.hf, "Hugging Face directory")):
        if path is not None and missing_path(path, what):
            return report_user_error("sera-eval", missing_path(path, what))
    use_compilation_cache()
    out = args.out or str(Path(cfg.train.out_dir) / "eval")

    import jax

    from sera_jax.evaluation.passes import PassSpec, evaluate

    speak = jax.process_index() == 0  # a multi-host job's report is gathered: process 0 alone prints it

    def show(r: int, table: dict) -> None:
        if speak:
            print(json.dumps({"run": r, **{k: round(v["rate"], 4) for k, v in table.items()}}), flush=True)

    spec = PassSpec(checkpoint=args.checkpoint, hf_dir=args.hf, version=args.version, tokenizer=args.tokenizer,
                    num_tasks=args.tasks if args.tasks is not None else cfg.eval.num_tasks, num_runs=args.runs,
                    num_shards=args.num_shards, shard_index=args.shard_index)
    try:
        with no_empty_folder(out):
            rep = asyncio.run(evaluate(cfg, out_dir=out, spec=spec, on_run=show, progress=speak))
    except UserError as e:
        return report_user_error("sera-eval", e)
    except KeyboardInterrupt:
        print(f"sera-eval: {preemption.how()}; every finished tree is saved in {out}; the same command finishes "
              "the pass", file=sys.stderr)
        return preemption.exit_status()
    end_processes()
    if not speak or rep is None:
        return 0
    return _print_report(rep, out)


def _read_only(args: argparse.Namespace) -> int:
    """``--status DIR`` / ``--aggregate DIR``: no JAX, no lock."""
    from sera_jax.evaluation.store import format_status, status

    try:
        if args.status is not None:
            print(format_status(status(args.status)))
            return 0
        from sera_jax.evaluation.passes import aggregate

        rep = aggregate(args.aggregate)
    except UserError as e:
        return report_user_error("sera-eval", e)
    return _print_report(rep, args.aggregate)


if __name__ == "__main__":
    sys.exit(main())
