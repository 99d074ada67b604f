"""Command-line entry points (thin: parse arguments, call the library, print what happened)."""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from pathlib import Path


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
                   for k in ("groups_accepted", "groups_started", "trainable_datums", "root_success",
                             "delegation_rate", "rubric_ranking_auc", "loss", "grad_norm", "time/rollout_s",
                             "time/train_s") if k in m}}
        print(json.dumps(line), flush=True)

    if args.dry_run:
        init = cfg.model.init_from
        if init is not None and not (Path(init) / "checkpoints").is_dir():
            # A dry run checks the machinery, not the policy: it does not spend minutes building the warm start.
            print(f"dry run: no warm start in {init}; starting from random weights", file=sys.stderr)
            cfg = dataclasses.replace(cfg, model=dataclasses.replace(cfg.model, init_from=None))

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
                # the checkpoint path is part of the machinery: save once whatever the attempts did (an attempt
                # that found no trainable batch advances no version, so no periodic save need have happened)
                loop.save(force=True)
                loop.checkpointer.wait()
                return outcomes
        outcomes = asyncio.run(dry())
        print(json.dumps({"dry_run": "ok", "stages": [o.stage for o in outcomes],
                          "updated": [not o.skipped for o in outcomes]}))
        return 0
    from tqdm import tqdm

    bar = tqdm(total=cfg.train.total_steps, desc="policy versions", unit="step", dynamic_ncols=True)

    def progress(o) -> None:
        if bar.n == 0 and o.version > 0 and not o.skipped:
            bar.update(o.version - 1)  # resumed run: start the bar where the checkpoint left off
        if not o.skipped:
            bar.update(1)
        m = o.metrics
        bar.set_postfix(stage=o.stage, success=round(m.get("root_success", 0.0), 3),
                        loss=round(m.get("loss", float("nan")), 4), skipped=o.skipped)
        with bar.external_write_mode():
            show(o)

    try:
        if cfg.warmstart.enabled:
            from sera_jax.default_run import run_default

            asyncio.run(run_default(cfg, out_dir=args.out, on_step=progress,
                                    log=lambda m: bar.write(m)))
        else:
            asyncio.run(train_from_config(cfg, out_dir=args.out, on_step=progress))
    except KeyboardInterrupt:
        # The loop saved a checkpoint on the way out (Loop.run), and finished evaluations keep their reports.
        bar.close()
        out = args.out or cfg.train.out_dir
        print(f"sera-train: interrupted; the same command resumes ({out} keeps the newest checkpoint and the "
              "finished evaluations)", file=sys.stderr)
        return 130
    finally:
        bar.close()
    return 0


def warmstart_main(argv: list[str] | None = None) -> int:
    """``sera-warmstart [CONFIG.yaml ...] [a.b=c ...] [--out DIR]``: build the oracle warm start of a config."""
    p = argparse.ArgumentParser(prog="sera-warmstart", description=(
        "Supervised warm start on oracle demonstrations (TextCraft): the oracle plays the config's tasks through "
        "the runtime (acting, delegating, writing rubrics, scoring children); the policy is fine-tuned on them for "
        "warmstart.steps updates and saved where model.init_from (default: warmstart.out_dir) reads it."))
    p.add_argument("args", nargs="*", help="config files and a.b=c overrides (default: the tiny CPU config)")
    p.add_argument("--out", default=None, help="output run directory (default: model.init_from or warmstart.out_dir)")
    p.add_argument("--ship", action="store_true",
                   help="build from scratch (never copy the shipped one) and rewrite the package's shipped warm start")
    args = p.parse_args(argv)
    from sera_jax.config import ConfigError, load_config, split_cli

    paths, overrides = split_cli(args.args)
    try:
        cfg = load_config(paths or [_default_config_path()], overrides, check_paths=True)
    except ConfigError as e:
        print(f"config error: {e}", file=sys.stderr)
        return 2
    if cfg.env.name != "textcraft":
        print("sera-warmstart: the oracle warm start exists for TextCraft only", file=sys.stderr)
        return 2
    from sera_jax.warmstart import ship, warm_start

    out = warm_start(cfg, args.out or cfg.model.init_from or cfg.warmstart.out_dir, use_shipped=not args.ship)
    if args.ship:
        print(f"shipped warm start written to {ship(cfg, out)}")
    return 0


def eval_main(argv: list[str] | None = None) -> int:
    """``sera-eval [CONFIG.yaml ...] [a.b=c ...] [--checkpoint DIR | --hf DIR] [--tasks N] [--runs R] [--out DIR]``:
    the paper's evaluation protocol; prints the Markdown table and a ``RESULT`` line; returns the exit code."""
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
    args = p.parse_args(argv)
    import asyncio
    from pathlib import Path

    from sera_jax.config import ConfigError, load_config, split_cli

    paths, overrides = split_cli(args.args)
    try:
        # The policy given on the command line replaces the config's model: its model.hf_dir need not exist.
        cfg = load_config(paths or [_default_config_path()], overrides,
                          check_paths=args.checkpoint is None and args.hf is None)
    except ConfigError as e:
        print(f"config error: {e}", file=sys.stderr)
        return 2
    if (args.tasks is not None and args.tasks <= 0) or (args.runs is not None and args.runs <= 0):
        print("--tasks and --runs must be positive", file=sys.stderr)
        return 2
    from sera_jax.eval_run import evaluate

    out = args.out or str(Path(cfg.train.out_dir) / "eval")

    def show(r: int, table: dict) -> None:
        print(json.dumps({"run": r, **{k: round(v["rate"], 4) for k, v in table.items()}}), flush=True)

    if args.version is not None and args.checkpoint is None:
        print("--version needs --checkpoint", file=sys.stderr)
        return 2
    rep = asyncio.run(evaluate(cfg, out_dir=out, checkpoint=args.checkpoint, hf_dir=args.hf,
                               num_tasks=args.tasks if args.tasks is not None else cfg.eval.num_tasks,
                               num_runs=args.runs, on_run=show, version=args.version))
    print(rep["markdown"])
    m, s = rep["mean_std"]["overall"]
    errored = sum(t["overall"]["errored"] for t in rep["runs"])
    print(f"RESULT env={rep['env']} tasks={rep['num_tasks']} runs={rep['num_runs']} success_mean={m:.4f} "
          f"success_std={s:.4f} errored={errored} out={out}")
    return 0


def compare_main(argv: list[str] | None = None) -> int:
    """``sera-compare [--checkpoint DIR | --hf DIR]``: our logits, token logprobs (trainer and engine), CISPO loss and
    gradient norm against PyTorch/transformers on the same fp32 weights; prints a table and a ``RESULT`` line;
    returns 0 when every quantity is within tolerance, 1 otherwise, 3 when torch/transformers are missing."""
    p = argparse.ArgumentParser(prog="sera-compare", description=(
        "Compare sera-jax with PyTorch/transformers' Qwen3 on the same weights (fp32): logits, token logprobs of "
        "the trainer and of the rollout engine's greedy tokens, CISPO loss and gradient norm. Default: the tiny "
        "preset with random weights."))
    src = p.add_mutually_exclusive_group()
    src.add_argument("--checkpoint", default=None, help="run directory or its checkpoints/ (latest version)")
    src.add_argument("--hf", default=None, help="Hugging Face directory")
    p.add_argument("--version", type=int, default=None, help="checkpoint version (default: latest)")
    p.add_argument("--seed", type=int, default=0, help="random tokens (and the tiny default's weights)")
    p.add_argument("--batch", type=int, default=2)
    p.add_argument("--seq-len", type=int, default=48)
    p.add_argument("--new-tokens", type=int, default=12, help="greedy tokens generated by the engine")
    p.add_argument("--tol", type=float, default=1e-4, help="tolerance on each error (fp32: 1e-4)")
    p.add_argument("--json", default=None, help="also write the result as JSON to this path")
    args = p.parse_args(argv)
    from sera_jax.compare import MissingTorch, compare, format_table, result_line

    try:
        result = compare(checkpoint=args.checkpoint, hf_dir=args.hf, seed=args.seed, batch=args.batch,
                         seq_len=args.seq_len, new_tokens=args.new_tokens, tol=args.tol, version=args.version)
    except MissingTorch as e:
        print(f"sera-compare: {e}", file=sys.stderr)
        return 3
    print(format_table(result))
    print(result_line(result), flush=True)
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(result, fh, indent=1)
    return 0 if result["ok"] else 1
