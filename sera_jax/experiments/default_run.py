"""The embedded default run (``sera-train`` with no argument): warm start → evaluate → SERA training → evaluate.

1. The oracle warm start (``warmstart.py``) is built into ``model.init_from`` unless a checkpoint is already there.
2. The warm-started policy is evaluated on ``eval.task_set`` / ``eval.difficulties`` (the official Easy validation
   tasks for the tiny default, one tree per task sampled at ``eval.temperature``) — ``eval_before/``.
3. SERA training runs to ``train.total_steps`` versions (the 16:2:2 stage schedule, the same loop as at scale).
4. The trained policy is evaluated the same way — ``eval_after/`` — and ``summary.json``/``summary.md`` put both
   side by side; ``learning_curve.png`` plots root success, rubric ranking accuracy and delegation rate per step.

With ``eval.rubric_probe_groups`` > 0 both evaluations also run the rubric probe (``evaluation/rubric_probe.py``):
the policy's rubrics on one fixed set of held-out fork groups, ``rubric_probe.json`` next to each report; the set
(``eval.rubric_probe_set``) is collected by the starting policy when missing.

A rerun resumes: finished evaluations are read back from their reports, training resumes from its checkpoint.
"""

from __future__ import annotations

import json
import math
import re
from pathlib import Path
from typing import Any, Callable

import jax

from sera_jax.evaluation.passes import PassSpec, evaluate
from sera_jax.evaluation.report import DIFFICULTY_ORDER
from sera_jax.training.build import build_loop
from sera_jax.training.metrics import read_metrics
from sera_jax.warmstart.sft import warm_start

# One panel per entry: (y-axis label, series); a series is (metrics key, legend label or None = colour by stage).
CURVE_PANELS = (
    ("root success (training rollouts)", (("root_success", None),)),
    ("rubric ranking accuracy", (("rubric_ranking_accuracy", None),
                                 ("subagent_score_accuracy", "scored sub-agents: ranking (execution)"),
                                 ("subagent_score_agreement", "scored sub-agents: flag = success (execution)"))),
    ("delegation rate", (("delegation_rate", None),)),
)
STAGE_COLORS = {"execution": "tab:blue", "delegation": "tab:orange", "rubric_generation": "tab:green"}


def learning_curve(metrics_path: str | Path, png_path: str | Path, *, title: str = "",
                   probe: tuple[dict | None, dict | None] = (None, None)) -> Path:
    """Writes the learning curve of a run's ``metrics.jsonl`` (the ``CURVE_PANELS``, per attempted step; a stage's
    points in its colour) to ``png_path``; returns the path. The rubric panel shows the rubric-generation stage's
    fork-group ranking accuracy and, at execution steps, how the policy's scores of its sub-agents match their
    programmatic success (``step_stats``); with ``probe`` (the rubric probe's numbers before and after training),
    its ranking accuracy as two stars at the first and last step."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = [r for r in read_metrics(metrics_path) if r.get("kind") == "step"]
    fig, axes = plt.subplots(len(CURVE_PANELS), 1, figsize=(7, 2.4 * len(CURVE_PANELS)), sharex=True)
    markers = iter(("x", "+", "^"))
    for ax, (label, series) in zip(axes, CURVE_PANELS):
        for key, name in series:
            pts = [(i, r[key], r.get("stage", "")) for i, r in enumerate(rows)
                   if isinstance(r.get(key), (int, float))]
            if not pts:
                continue
            if name is None:
                ax.plot([p[0] for p in pts], [p[1] for p in pts], color="0.7", lw=1)
                for stage, c in STAGE_COLORS.items():
                    sel = [p for p in pts if p[2] == stage]
                    if sel:
                        ax.scatter([p[0] for p in sel], [p[1] for p in sel], s=14, color=c, label=stage)
            else:
                ax.plot([p[0] for p in pts], [p[1] for p in pts], ls=":", marker=next(markers), ms=5, lw=1,
                        color="0.35", label=name)
        if label == "rubric ranking accuracy":
            ends = [(x, p["ranking_accuracy"]) for x, p in zip((0, max(len(rows) - 1, 0)), probe)
                    if p and isinstance(p.get("ranking_accuracy"), (int, float))]
            if ends:
                ax.plot([e[0] for e in ends], [e[1] for e in ends], ls="--", marker="*", ms=10, lw=1,
                        color="tab:red", label="rubric probe (fixed held-out fork groups)")
        ax.set_ylabel(label, fontsize=8)
        ax.set_ylim(-0.05, 1.05)
        ax.grid(alpha=0.3)
        handles, names = ax.get_legend_handles_labels()
        if handles and (ax is axes[0] or any(n not in STAGE_COLORS for n in names)):
            ax.legend(fontsize=7, loc="lower right")
    axes[-1].set_xlabel("attempted step (skipped steps included)")
    if title:
        axes[0].set_title(title, fontsize=9)
    fig.tight_layout()
    png_path = Path(png_path)
    fig.savefig(png_path, dpi=110)
    plt.close(fig)
    return png_path


async def _evaluate(cfg: Any, loop: Any, out_dir: Path, log: Callable[[str], None]) -> dict[str, Any]:
    """Returns the evaluation report in ``out_dir`` (read back when it exists, else run on the loop's engine)."""
    report_path = out_dir / "report.json"
    if report_path.is_file():
        return json.loads(report_path.read_text())
    rep = await evaluate(cfg, out_dir=out_dir, generator=loop.engine, tokenizer=loop.tokenizer,
                         spec=PassSpec(num_tasks=cfg.eval.num_tasks), progress=True)
    log(f"evaluation ({out_dir.name}): {json.dumps(rep['runs'][0]['overall'])}")
    return rep


async def _probe(cfg: Any, loop: Any, out_dir: Path, set_path: Path, log: Callable[[str], None], *,
                 may_collect: bool) -> dict[str, Any] | None:
    """Returns the rubric probe's numbers for the loop's current policy (read back from ``out_dir`` when there), or
    None when the probe is off, or when its set is missing and the policy is no longer the starting one."""
    from sera_jax.evaluation.rubric_probe import PROBE_FILE, collect_probe_set, load_probe_set, score_probe

    e = cfg.eval
    path = out_dir / PROBE_FILE
    if e.rubric_probe_groups <= 0:
        return None
    if jax.process_count() > 1:  # its set and scores are one process's files; not split over a multi-host job
        log("rubric probe: not measured in a multi-process job (run sera-train's default on one host for it)")
        return None
    if path.is_file():
        return json.loads(path.read_text())
    if not set_path.is_file():
        if not may_collect:
            log(f"rubric probe: no set at {set_path} and the policy is past its start: not measured")
            return None
        await collect_probe_set(cfg, loop.engine, loop.tokenizer, set_path, groups=e.rubric_probe_groups,
                                seed=e.rubric_probe_seed, log=log)
    probe = await score_probe(cfg, load_probe_set(set_path), loop.engine, loop.tokenizer,
                              samples=e.rubric_probe_samples, seed=e.rubric_probe_seed + cfg.train.seed)
    probe = {"set": str(set_path), "version": loop.version, **probe}
    out_dir.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(probe, indent=1) + "\n")
    log(f"rubric probe ({out_dir.name}): " + ", ".join(f"{k} {v:.3f}" for k, v in probe.items()
                                                       if isinstance(v, float)))
    return probe


def _decoding(temperature: float) -> str:
    return "greedy" if temperature == 0 else f"one tree sampled at temperature {temperature:g} per task"


def success_rate(rep: dict[str, Any]) -> float:
    """Returns the overall success rate (%) of an evaluation report (first run)."""
    return float(rep["overall_rate_mean"])


# Task ids of sets generated from a seed range of our own carry the base seed ("…_test900000_…",
# envs_py.textworld_sync.task_sets); the official records' ids do not.
_SEEDED_ID = re.compile(r"_(?:test|dev|train)\d+_")


def success_table(rep: dict[str, Any]) -> list[dict[str, Any]]:
    """Returns one evaluation's (first run's) success per tier, overall and — when the set mixes them — over the
    official records and the generated held-out tasks: rows {group, n, successful, rate (%), binomial_sd (points:
    the sd of one evaluation's rate, sqrt(p(1 - p) / n))}."""
    recs = (rep.get("tasks") or [[]])[0]
    groups: dict[str, list[bool]] = {}
    for r in recs:
        groups.setdefault(str(r.get("difficulty", "")), []).append(bool(r.get("success")))
    order = [d for d in DIFFICULTY_ORDER if d in groups] + sorted(set(groups) - set(DIFFICULTY_ORDER))
    rows = [(d, groups[d]) for d in order] + [("overall", [bool(r.get("success")) for r in recs])]
    official = [bool(r.get("success")) for r in recs if not _SEEDED_ID.search(str(r.get("task_id", "")))]
    if 0 < len(official) < len(recs):
        rows += [("official records", official),
                 ("generated held-out", [bool(r.get("success")) for r in recs
                                         if _SEEDED_ID.search(str(r.get("task_id", "")))])]
    out = []
    for name, ok in rows:
        n, k = len(ok), sum(ok)
        p = k / n if n else 0.0
        out.append({"group": name, "n": n, "successful": k, "rate": 100.0 * p,
                    "binomial_sd": 100.0 * math.sqrt(p * (1 - p) / n) if n else 0.0})
    return out


def _table_md(before: list[dict] | None, after: list[dict]) -> str:
    b = {r["group"]: r for r in before or []}
    lines = ["| tasks | n | before | after |", "|---|---|---|---|"]
    for r in after:
        x = b.get(r["group"])
        cell = f"{x['rate']:.1f}% ± {x['binomial_sd']:.1f}" if x else "n/a"
        lines.append(f"| {r['group']} | {r['n']} | {cell} | {r['rate']:.1f}% ± {r['binomial_sd']:.1f} |")
    return "\n".join(lines)


async def run_default(cfg: Any, *, out_dir: str | Path | None = None, on_step: Callable | None = None,
                      log: Callable[[str], None] = print) -> dict[str, Any]:
    """Runs the four phases of the module docstring; returns the summary (also written to ``summary.json``)."""
    out = Path(out_dir or cfg.train.out_dir)
    out.mkdir(parents=True, exist_ok=True)
    if cfg.warmstart.enabled and cfg.model.init_from is not None:
        if jax.process_count() > 1 and not (Path(cfg.model.init_from) / "checkpoints").is_dir():
            raise ValueError(f"a multi-process job does not build its warm start: make {cfg.model.init_from} on "
                             "one host first (sera-warmstart, or sera-export --import of the shipped one)")
        if jax.process_count() == 1:
            warm_start(cfg, cfg.model.init_from, log=log)
    async with build_loop(cfg, out_dir=out) as loop:
        start_version = loop.version
        before = await _evaluate(cfg, loop, out / "eval_before", log) if start_version == 0 or \
            (out / "eval_before" / "report.json").is_file() else None
        probe_set = Path(cfg.eval.rubric_probe_set or out / "rubric_probe_set.jsonl")
        probe_before = await _probe(cfg, loop, out / "eval_before", probe_set, log, may_collect=loop.version == 0) \
            if before is not None else None
        outcomes = await loop.run(cfg.train.total_steps, on_step=on_step)
        after = await _evaluate(cfg, loop, out / "eval_after", log)
        probe_after = await _probe(cfg, loop, out / "eval_after", probe_set, log, may_collect=False)
    if jax.process_index() != 0:  # the run's record is process 0's to write
        return {"success_before": success_rate(before) if before else None, "success_after": success_rate(after)}
    curve = learning_curve(out / "metrics.jsonl", out / "learning_curve.png",
                           title=f"{cfg.name}: {cfg.method.name} on {cfg.env.name} (seed {cfg.train.seed})",
                           probe=(probe_before, probe_after))
    summary = {
        "eval_task_set": cfg.eval.task_set, "eval_difficulties": list(cfg.eval.difficulties),
        "success_before": success_rate(before) if before else None, "success_after": success_rate(after),
        "eval_tasks": after.get("num_tasks"), "versions": loop.version, "attempts_this_run": len(outcomes),
        "skipped_this_run": sum(o.skipped for o in outcomes), "learning_curve": str(curve),
        "table_before": success_table(before) if before else None, "table_after": success_table(after),
        "advantage_sign": cfg.step.advantage_sign, "seed": cfg.train.seed,
        "eval_temperature": cfg.eval.temperature, "rubric_probe_before": probe_before,
        "rubric_probe_after": probe_after,
    }
    (out / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    before_txt = f"{summary['success_before']:.1f}%" if before else "n/a (resumed run)"
    (out / "summary.md").write_text(
        f"# {cfg.name}\n\nHeld-out success ({cfg.eval.task_set}, {', '.join(cfg.eval.difficulties) or 'all'}; "
        f"{summary['eval_tasks']} tasks, {_decoding(cfg.eval.temperature)}): before {before_txt} → "
        f"after {summary['success_after']:.1f}% after {summary['versions']} policy versions.\n\n"
        "Per tier (± the binomial sd of one evaluation, sqrt(p(1 − p)/n), in points):\n\n"
        f"{_table_md(summary['table_before'], summary['table_after'])}\n\n"
        "![learning curve](learning_curve.png)\n")
    log(f"held-out success: before {before_txt} -> after {summary['success_after']:.1f}%  ({out / 'summary.md'})")
    return summary
