"""``sera-ablate``: the paper's comparison (Table 1) at a scale anyone can run — methods × seeds of one setting, in
sequence, from one shared warm start, then one report.

Each (method, seed) is a full default run (``default_run.run_default``: evaluation before, training, evaluation
after, learning curve) in ``<out>/<method>/seed<seed>/``, on the base config with the method's overrides
(``VARIANTS``). Every method starts from the same warm start (``<out>/warmstart``, built once from the base config's
recipe: the method does not change which policy it starts from) and keeps the base config's number of updates;
a method without a stage gives that stage's updates to execution (the paper's schedules, shortened as the base
config shortens SERA's). A finished run (``run_record.json``) is never rerun (its record is recomputed from its
files, so a report always uses the current definitions), an interrupted one resumes from its
checkpoints, so the command can be repeated until every run is done. Runs go seed by seed (every method's first
seed, then the second, ...). The evaluation before training is the same measurement for every method of a seed
(same warm start, evaluation and seed), so it runs once per seed and the other methods' runs reuse it.

The report (``report.md``, ``report.json``, ``comparison.png``), per method over its seeds: held-out success
after training (mean ± sample std) and its gain over before, delegation (training trees that delegate; delegations
per evaluated tree), rubric quality at the first and last step that measured it (fork-group ranking accuracy and
AUC at rubric-generation steps; scored sub-agents' ranking accuracy at execution steps), the rubric stage's loss
and gradient norm, how many rubric steps had a gradient at all (a non-zero advantage), wall time per step by
stage, with each method's total against RAO's (the paper's SERA run cost 1.84× RAO's), and the judge requests
training sent (TextWorld's sub-agent and branch labels; the paper: RAO 147.80K, SERA 35.79K). With the rubric probe on
(``eval.rubric_probe_groups``), one probe set (``<out>/rubric_probe_set.jsonl``, collected by the warm start) is
shared by every run, and the report adds each method's probe ranking accuracy, AUC and valid-rubric share before →
after training, with the change as the mean of per-seed differences.
"""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path
from typing import Any, Callable, Sequence

import numpy as np

from sera_jax.config import load_config
from sera_jax.evaluation.rubric_probe import PROBE_FILE
from sera_jax.rl.stages import parse_schedule
from sera_jax.training.metrics import read_metrics

# slug -> (label, overrides, schedule rule). The rule maps the base schedule to the method's: "keep", "drop:<stage>"
# (its updates go to execution) or a fixed schedule.
VARIANTS: dict[str, tuple[str, tuple[str, ...], str]] = {
    "sera": ("SERA", (), "keep"),
    "sera_wo_d": ("SERA w/o D", ("method.name=sera_wo_d",), "drop:delegation"),
    "sera_wo_d_rt": ("SERA w/o D & RT", ("method.name=sera_wo_d_rt",), "execution:1"),
    "rao": ("RAO", ("method.name=rao",), "execution:1"),
    # Controls for the self-evaluation question (not methods of the paper): the rubric objective removed, or pushed
    # the wrong way (its advantages negated); the other stages as in SERA.
    "sera_wo_rt": ("SERA w/o RT (control)", (), "drop:rubric_generation"),
    "sera_rt_flipped": ("SERA, RT sign flipped (control)", ("method.rubric_advantage_sign=-1",), "keep"),
    # The sign control of the whole method (as the TextCraft default's issue-#11 control): every stage's advantages
    # negated, so a method that learns must get worse.
    "sera_sign_flipped": ("SERA, advantage sign flipped (control)", ("step.advantage_sign=-1",), "keep"),
    # The paper's rubric-design grid (its Scripts/Ablation/textcraft/): SERA w/o D&RT with another rubric writer
    # and/or scorer (docs/design/roles.md). The external model is $SERA_EXTERNAL_ENDPOINT / $SERA_EXTERNAL_MODEL;
    # sera-ablate starts a sera-serve of the frozen warm start for them when those are unset.
    "kimi_rubric_policy_scorer": ("Kimi rubric / policy scorer", (
        "method.name=sera_wo_d_rt", "roles.rubric_writer.backend=endpoint"), "execution:1"),
    "kimi_rubric_kimi_scorer": ("Kimi rubric / Kimi scorer", (
        "method.name=sera_wo_d_rt", "roles.rubric_writer.backend=endpoint", "roles.scorer.backend=endpoint"),
        "execution:1"),
    "global_rubric_policy_scorer": ("Global rubric / policy scorer", (
        "method.name=sera_wo_d_rt", "roles.rubric_writer.backend=file"), "execution:1"),
}
# The grid of the paper's rubric-design ablation: policy/policy (SERA w/o D&RT), Kimi/policy, Kimi/Kimi, global/policy.
RUBRIC_GRID = ("sera_wo_d_rt", "kimi_rubric_policy_scorer", "kimi_rubric_kimi_scorer", "global_rubric_policy_scorer")


def needs_endpoint(methods: Sequence[str]) -> bool:
    """Returns whether one of ``methods`` has a role played by an external endpoint."""
    return any(o.endswith(".backend=endpoint") for m in methods for o in VARIANTS[m][1])
DEFAULT_METHODS = ("sera", "sera_wo_d", "sera_wo_d_rt", "rao")
RECORD = "run_record.json"
PROBE_SET = "rubric_probe_set.jsonl"  # one probe set per ablation: every method and seed ranks the same groups
PROBE_KEYS = ("ranking_accuracy", "ranking_auc", "rubric_valid", "ranked", "hinge_reward", "ranking_accuracy_all")


def method_schedule(base: str, rule: str) -> str:
    """Returns the schedule of a method from the base config's SERA schedule (see ``VARIANTS``)."""
    if rule == "keep":
        return base
    if not rule.startswith("drop:"):
        parse_schedule(rule)
        return rule
    gone = rule.split(":", 1)[1]
    parts = list(parse_schedule(base))
    freed = sum(n for s, n in parts if s == gone)
    out = [(s, n + (freed if s == "execution" else 0)) for s, n in parts if s != gone]
    if not any(s == "execution" for s, _ in out):
        out.insert(0, ("execution", freed))
    return ",".join(f"{s}:{n}" for s, n in out)


def run_overrides(base_cfg: Any, method: str, seed: int, run_dir: Path, warm_dir: Path) -> list[str]:
    """Returns the ``a.b=c`` overrides that turn the base config into ``method``'s run for ``seed``."""
    if method not in VARIANTS:
        raise ValueError(f"unknown method {method!r}; choose from {', '.join(VARIANTS)}")
    _, over, rule = VARIANTS[method]
    schedule = method_schedule(base_cfg.method_config().stage_schedule, rule)
    probe = [f"eval.rubric_probe_set={warm_dir.parent / PROBE_SET}"] if base_cfg.eval.rubric_probe_groups > 0 else []
    return [*over, f"method.stage_schedule={schedule}", f"train.seed={seed}", f"train.out_dir={run_dir}",
            f"model.init_from={warm_dir}", "warmstart.enabled=false", *probe]


def _first_last(rows: Sequence[dict], key: str, stage: str | None = None) -> tuple[float | None, float | None]:
    vals = [r[key] for r in rows if isinstance(r.get(key), (int, float)) and (stage is None or r.get("stage") == stage)]
    return (float(vals[0]), float(vals[-1])) if vals else (None, None)


def _mean(xs) -> float | None:
    xs = [float(x) for x in xs if x is not None]
    return float(np.mean(xs)) if xs else None


def run_record(run_dir: Path, summary: dict[str, Any], wall_s: float) -> dict[str, Any]:
    """Returns one run's numbers for the report, from its ``summary.json`` content and ``metrics.jsonl``."""
    rows = [r for r in read_metrics(run_dir / "metrics.jsonl") if r.get("kind") == "step"]
    stages: dict[str, list[float]] = {}
    for r in rows:
        if isinstance(r.get("time/step_s"), (int, float)):
            stages.setdefault(r.get("stage", "?"), []).append(float(r["time/step_s"]))
    rubric_rows = [r for r in rows if r.get("stage") == "rubric_generation"
                   and not r.get("skipped_step", r.get("skipped"))]  # the trained ones
    after = json.loads((run_dir / "eval_after" / "report.json").read_text()) \
        if (run_dir / "eval_after" / "report.json").is_file() else {}
    tree_means = (after.get("tree_means") or [{}])[0]
    rec = {
        "eval_tasks": after.get("num_tasks"),
        "success_before": summary.get("success_before"), "success_after": summary.get("success_after"),
        "attempts": len(rows),
        "skipped": sum(bool(r.get("skipped_step", r.get("skipped"))) for r in rows),
        "delegation_rate": _mean(r.get("delegation_rate") for r in rows),
        "eval_delegations_per_tree": tree_means.get("delegations"),
        "step_s_by_stage": {k: float(np.mean(v)) for k, v in stages.items()},
        "steps_by_stage": {k: len(v) for k, v in stages.items()},
        "train_s": float(sum(sum(v) for v in stages.values())), "wall_s": float(wall_s),
        # Supervision spent in training (every attempt, skipped ones included: the requests were sent): all judge
        # requests (TextWorld: the RAO family's sub-agent labels and the rubric stage's branch labels) and those of
        # the execution labels alone.
        "judge_calls": float(sum(r.get("supervision/judge_calls", 0.0) for r in rows)),
        "execution_judge_calls": float(sum(r.get("supervision/execution_judge_calls", 0.0) for r in rows)),
        "judge_labels": float(sum(r.get("supervision/judge_labels", 0.0) for r in rows)),
        # What each role spent in training (roles/<role>/<backend>/<field>, every attempt), the trajectory tokens
        # (the actor's completions) and the external supervision: requests to endpoints and the replies they gave
        # that were used (calls − failures), so methods compare at equal supervision, not only at equal steps.
        "roles": role_totals(rows),
        "trajectory_tokens": float(sum(r.get("completion_tokens", 0.0) for r in rows)),
        "rubric_loss": _mean(r.get("loss") for r in rubric_rows),
        "rubric_grad_norm": _mean(r.get("grad_norm") for r in rubric_rows),
        "ranking_accuracy_series": [r.get("rubric_ranking_accuracy") for r in rows
                                    if r.get("stage") == "rubric_generation"],
    }
    rec["endpoint_calls"] = float(sum(v["calls"] for k, v in rec["roles"].items() if k.endswith("/endpoint")))
    rec["endpoint_outputs_used"] = float(sum(v["calls"] - v["failures"] for k, v in rec["roles"].items()
                                             if k.endswith("/endpoint")))
    rec["endpoint_calls_per_s"] = rec["endpoint_calls"] / rec["train_s"] if rec["train_s"] else None
    for when in ("before", "after"):
        path = run_dir / f"eval_{when}" / PROBE_FILE
        probe = json.loads(path.read_text()) if path.is_file() else {}
        for k in PROBE_KEYS:
            rec[f"probe_{k}_{when}"] = probe.get(k)
    rubric_steps = [r for r in rubric_rows if isinstance(r.get("ranked_groups"), (int, float))]
    rec["rubric_steps_trained"] = len(rubric_rows)
    # A rubric step has a gradient iff some trained advantage is non-zero (≥ 2 ranked fork groups with different
    # rewards); ranked_groups counts every collected tree's groups, rejected task groups included.
    rec["rubric_steps_with_gradient"] = sum(1 for r in rubric_rows if r.get("advantage_abs_max", 0.0) > 1e-9)
    rec["ranked_groups_per_rubric_step"] = _mean(r["ranked_groups"] for r in rubric_steps)
    for key, stage in (("rubric_ranking_accuracy", "rubric_generation"), ("rubric_ranking_auc", "rubric_generation"),
                       ("subagent_score_accuracy", None), ("subagent_score_auc", None)):
        rec[key + "_first"], rec[key + "_last"] = _first_last(rows, key, stage)
    return rec


def role_totals(rows: Sequence[dict]) -> dict[str, dict[str, float]]:
    """Returns ``{"<role>/<backend>": {calls, prompt_tokens, completion_tokens, failures}}`` summed over step rows."""
    out: dict[str, dict[str, float]] = {}
    for r in rows:
        for k, v in r.items():
            if k.startswith("roles/") and isinstance(v, (int, float)):
                _, role, backend, field = k.split("/", 3)
                out.setdefault(f"{role}/{backend}", {f: 0.0 for f in ROLE_FIELDS})[field] += float(v)
    return out


ROLE_FIELDS = ("calls", "prompt_tokens", "completion_tokens", "failures")


def _ms(xs) -> tuple[float | None, float | None]:
    xs = [float(x) for x in xs if x is not None]
    if not xs:
        return None, None
    return float(np.mean(xs)), (float(np.std(xs, ddof=1)) if len(xs) > 1 else 0.0)


def aggregate(records: dict[str, dict[int, dict[str, Any]]]) -> dict[str, dict[str, Any]]:
    """Returns per method: mean and sample std over seeds of every reported number."""
    out = {}
    for m, by_seed in records.items():
        recs = list(by_seed.values())
        row: dict[str, Any] = {"label": VARIANTS[m][0], "seeds": sorted(by_seed)}
        for key in ("eval_tasks", "success_before", "success_after", "delegation_rate", "eval_delegations_per_tree",
                    "train_s", "wall_s", "judge_calls", "execution_judge_calls", "judge_labels", "rubric_loss",
                    "rubric_grad_norm", "rubric_ranking_accuracy_first",
                    "rubric_ranking_accuracy_last", "rubric_ranking_auc_first", "rubric_ranking_auc_last",
                    "subagent_score_accuracy_first", "subagent_score_accuracy_last", "rubric_steps_trained",
                    "rubric_steps_with_gradient", "ranked_groups_per_rubric_step", "trajectory_tokens",
                    "endpoint_calls", "endpoint_outputs_used", "endpoint_calls_per_s",
                    *(f"probe_{k}_{w}" for k in PROBE_KEYS for w in ("before", "after"))):
            row[key] = _ms(r.get(key) for r in recs)
        for k in ("ranking_accuracy", "ranking_auc", "rubric_valid"):
            row[f"probe_{k}_gain"] = _ms(r[f"probe_{k}_after"] - r[f"probe_{k}_before"] for r in recs
                                         if r.get(f"probe_{k}_after") is not None
                                         and r.get(f"probe_{k}_before") is not None)
        row["gain"] = _ms(r["success_after"] - r["success_before"] for r in recs
                          if r.get("success_after") is not None and r.get("success_before") is not None)
        keys = sorted({k for r in recs for k in r.get("roles", {})})
        row["roles"] = {k: {f: _ms(r.get("roles", {}).get(k, {}).get(f, 0.0) for r in recs) for f in ROLE_FIELDS}
                        for k in keys}
        stages = sorted({s for r in recs for s in r["step_s_by_stage"]})
        row["step_s_by_stage"] = {s: _ms(r["step_s_by_stage"].get(s) for r in recs) for s in stages}
        out[m] = row
    if "rao" in out and out["rao"]["train_s"][0]:
        for row in out.values():
            row["train_s_vs_rao"] = row["train_s"][0] / out["rao"]["train_s"][0]
    # The external stand-in's load on a run: seconds per execution step added over policy/policy (SERA w/o D&RT).
    ref = (out.get("sera_wo_d_rt") or {}).get("step_s_by_stage", {}).get("execution", (None, None))[0]
    if ref is not None:
        for row in out.values():
            mine = row["step_s_by_stage"].get("execution", (None, None))[0]
            row["execution_step_s_added"] = None if mine is None else mine - ref
    return out


def _fmt(ms: tuple[float | None, float | None], digits: int = 1, scale: float = 1.0) -> str:
    m, s = ms
    if m is None:
        return "—"
    return f"{m * scale:.{digits}f} ± {s * scale:.{digits}f}"


def markdown(agg: dict[str, dict[str, Any]], title: str) -> str:
    """Returns the report as Markdown: the Table-1-style comparison, rubric quality, and cost."""
    sizes = {int(r["eval_tasks"][0]) for r in agg.values() if r.get("eval_tasks", (None,))[0]}
    noise = ""
    if len(sizes) == 1:  # one evaluation's binomial noise at the methods' mean rate before training
        n, p = sizes.pop(), _mean(r["success_before"][0] for r in agg.values()) or 0.0
        noise = (f" One evaluation of {n} tasks has a binomial sd of ±{100 * np.sqrt(p / 100 * (1 - p / 100) / n):.1f}"
                 f" points at the {p:.1f}% before training.")
    lines = [f"# {title}", "", f"Held-out success (%), mean ± sample std over seeds.{noise}", "",
             "| method | seeds | before | after | gain | delegating trees (train) | delegations / eval tree |",
             "|---|---|---|---|---|---|---|"]
    for m, r in agg.items():
        lines.append(f"| {r['label']} | {len(r['seeds'])} | {_fmt(r['success_before'])} | "
                     f"**{_fmt(r['success_after'])}** | {_fmt(r['gain'])} | {_fmt(r['delegation_rate'], 2)} | "
                     f"{_fmt(r['eval_delegations_per_tree'], 2)} |")
    lines += ["", "Rubric quality at the first → last step that measured it (fork groups: rubric-generation steps; "
              "scored sub-agents: execution steps), and the rubric stage's update:", "",
              "| method | fork-group ranking accuracy | fork-group AUC | sub-agent score ranking accuracy | "
              "rubric loss | rubric grad norm |", "|---|---|---|---|---|---|"]
    for m, r in agg.items():
        lines.append(
            f"| {r['label']} | {_fmt(r['rubric_ranking_accuracy_first'], 2)} → "
            f"{_fmt(r['rubric_ranking_accuracy_last'], 2)} | {_fmt(r['rubric_ranking_auc_first'], 2)} → "
            f"{_fmt(r['rubric_ranking_auc_last'], 2)} | {_fmt(r['subagent_score_accuracy_first'], 2)} → "
            f"{_fmt(r['subagent_score_accuracy_last'], 2)} | {_fmt(r['rubric_loss'], 4)} | "
            f"{_fmt(r['rubric_grad_norm'], 3)} |")
    if any(r["probe_rubric_valid_after"][0] is not None for r in agg.values()):
        lines += ["", "The rubric probe (the same fixed held-out fork groups with both outcomes, several rubrics "
                  "each, before → after training; accuracy and AUC over the groups whose rubric and scores were valid, "
                  "change = mean of per-seed differences):", "",
                  "| method | ranking accuracy | change | AUC | change | valid rubrics | change | ranked | "
                  "hinge reward |", "|---|---|---|---|---|---|---|---|---|"]
        for m, r in agg.items():
            cells = []
            for k in ("ranking_accuracy", "ranking_auc", "rubric_valid"):
                cells += [f"{_fmt(r[f'probe_{k}_before'], 2)} → {_fmt(r[f'probe_{k}_after'], 2)}",
                          _fmt(r[f"probe_{k}_gain"], 2)]
            cells += [f"{_fmt(r['probe_ranked_before'], 2)} → {_fmt(r['probe_ranked_after'], 2)}",
                      f"{_fmt(r['probe_hinge_reward_before'], 3)} → {_fmt(r['probe_hinge_reward_after'], 3)}"]
            lines.append(f"| {r['label']} | " + " | ".join(cells) + " |")
    lines += ["", "Rubric-generation steps: trained, with a non-zero rubric gradient (some advantage ≠ 0: ≥ 2 ranked "
              "fork groups with different rewards), and ranked fork groups per trained step (in every tree the step "
              "collected, rejected task groups included):", "",
              "| method | trained | with gradient | ranked groups / step |", "|---|---|---|---|"]
    for m, r in agg.items():
        lines.append(f"| {r['label']} | {_fmt(r['rubric_steps_trained'], 1)} | "
                     f"{_fmt(r['rubric_steps_with_gradient'], 1)} | {_fmt(r['ranked_groups_per_rubric_step'], 2)} |")
    lines += ["", "Cost: seconds per training step by stage (rollouts + update), training total, and the whole "
              "run (both evaluations included); supervision: judge requests sent in training (all; of which the "
              "sub-agent execution labels) and the labels they gave:", "",
              "| method | execution | delegation | rubric generation | training total | vs RAO | whole run | "
              "judge calls | of which execution | judge labels |",
              "|---|---|---|---|---|---|---|---|---|---|"]
    for m, r in agg.items():
        st = r["step_s_by_stage"]
        cells = [_fmt(st[s], 1) if s in st else "—" for s in ("execution", "delegation", "rubric_generation")]
        vs = f"{r['train_s_vs_rao']:.2f}×" if "train_s_vs_rao" in r else "—"
        lines.append(f"| {r['label']} | {' | '.join(cells)} | {_fmt(r['train_s'], 0)} s | {vs} | "
                     f"{_fmt(r['wall_s'], 0)} s | {_fmt(r['judge_calls'], 0)} | "
                     f"{_fmt(r['execution_judge_calls'], 0)} | {_fmt(r['judge_labels'], 0)} |")
    lines += ["", "Supervision and spend: trajectory tokens (the actor's completions in training), requests to external "
              "endpoints (every attempt) and the replies used (calls − failures), endpoint calls per second of "
              "training, and seconds per execution step added over policy/policy (SERA w/o D & RT):", "",
              "| method | trajectory tokens | endpoint calls | endpoint replies used | endpoint calls / s | "
              "execution step s added |", "|---|---|---|---|---|---|"]
    for m, r in agg.items():
        added = r.get("execution_step_s_added")
        lines.append(f"| {r['label']} | {_fmt(r['trajectory_tokens'], 0)} | {_fmt(r['endpoint_calls'], 0)} | "
                     f"{_fmt(r['endpoint_outputs_used'], 0)} | {_fmt(r['endpoint_calls_per_s'], 2)} | "
                     f"{'—' if added is None else f'{added:+.1f}'} |")
    lines += ["", "Per-role spend in training (roles/<role>/<backend>, summed over each run, mean ± sample std over "
              "seeds): calls, prompt tokens, completion tokens, failures:", "",
              "| method | role / backend | calls | prompt tokens | completion tokens | failures |",
              "|---|---|---|---|---|---|"]
    for m, r in agg.items():
        for key, fields in r.get("roles", {}).items():
            lines.append(f"| {r['label']} | {key} | " + " | ".join(_fmt(fields[f], 0) for f in ROLE_FIELDS) + " |")
    return "\n".join(lines) + "\n"


def plot(agg: dict[str, dict[str, Any]], records: dict[str, dict[int, dict[str, Any]]], path: Path) -> Path:
    """Writes ``comparison.png``: held-out success before/after per method (seeds as points), the rubric probe's
    ranking accuracy before → after per seed (when measured), and fork-group ranking accuracy per rubric-generation
    step (one line per run)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    probed = any(r.get("probe_rubric_valid_after") is not None for seeds in records.values()
                 for r in seeds.values())
    fig, axes = plt.subplots(1, 3 if probed else 2, figsize=(16 if probed else 11, 3.8))
    ax, bx = axes[0], axes[-1]
    names = list(agg)
    if probed:  # the rubric probe: each seed's before → after, one short line per seed
        px = axes[1]
        for i, m in enumerate(names):
            for seed, r in sorted(records[m].items()):
                b, a = r.get("probe_ranking_accuracy_before"), r.get("probe_ranking_accuracy_after")
                if a is not None and b is not None:
                    px.plot([i - 0.15, i + 0.15], [b, a], marker="o", ms=3, lw=1, color=f"C{i}")
        px.set_xticks(range(len(names)), [agg[m]["label"] for m in names], rotation=20, ha="right", fontsize=7)
        px.set_ylabel("probe ranking accuracy (before → after)")
        px.set_ylim(-0.05, 1.05)
    for i, m in enumerate(names):
        seeds = records[m]
        after = [r["success_after"] for r in seeds.values() if r.get("success_after") is not None]
        before = [r["success_before"] for r in seeds.values() if r.get("success_before") is not None]
        if after:
            ax.bar(i, np.mean(after), yerr=np.std(after, ddof=1) if len(after) > 1 else 0, color="tab:blue",
                   alpha=0.6, capsize=4, label="after" if i == 0 else None)
            ax.scatter([i] * len(after), after, color="tab:blue", s=12, zorder=3)
        if before:
            ax.scatter([i] * len(before), before, color="0.3", marker="_", s=200, zorder=3,
                       label="before" if i == 0 else None)
        for seed, r in sorted(seeds.items()):
            ys = r["ranking_accuracy_series"]
            xs = [k for k, y in enumerate(ys) if y is not None]
            if xs:
                bx.plot(xs, [ys[k] for k in xs], marker="o", ms=3, lw=1, color=f"C{i}",
                        label=agg[m]["label"] if seed == min(seeds) else None)
    ax.set_xticks(range(len(names)), [agg[m]["label"] for m in names], rotation=20, ha="right", fontsize=7)
    ax.set_ylabel("held-out success (%)")
    if ax.get_legend_handles_labels()[0]:
        ax.legend(fontsize=7)
    bx.set_xlabel("rubric-generation step")
    bx.set_ylabel("fork-group ranking accuracy")
    bx.set_ylim(-0.05, 1.05)
    if bx.get_legend_handles_labels()[0]:
        bx.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def ablate(paths: Sequence[str], overrides: Sequence[str], methods: Sequence[str], seeds: Sequence[int],
           out: str | Path, *, log: Callable[[str], None] = print,
           run: Callable[..., Any] | None = None) -> dict[str, Any]:
    """Runs every (method, seed) not yet finished under ``out``, then writes and returns the report."""
    from sera_jax.experiments.default_run import run_default
    from sera_jax.warmstart.sft import warm_start

    out = Path(out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    base = load_config(list(paths), list(overrides))
    bad = [m for m in methods if m not in VARIANTS]
    if bad:
        raise ValueError(f"unknown method(s) {bad}; choose from {', '.join(VARIANTS)}")
    warm_dir = out / "warmstart"
    warm_start(base, warm_dir, log=log)
    run = run or run_default
    records: dict[str, dict[int, dict[str, Any]]] = {m: {} for m in methods}
    failures: list[dict[str, Any]] = []
    for seed in seeds:  # seed-major: a partial report already compares every method
        for m in methods:
            run_dir = out / m / f"seed{seed}"
            rec_path = run_dir / RECORD
            if rec_path.is_file():
                log(f"ablate: {m} seed {seed} already done ({rec_path})")
                old = json.loads(rec_path.read_text())
                if (run_dir / "summary.json").is_file():  # derived numbers: recomputed from the run's own files
                    rec = {"method": m, "seed": seed, **run_record(
                        run_dir, json.loads((run_dir / "summary.json").read_text()), old["wall_s"])}
                    rec_path.write_text(json.dumps(rec, indent=1) + "\n")
            else:
                cfg = load_config(list(paths), [*overrides, *run_overrides(base, m, seed, run_dir, warm_dir)])
                log(f"ablate: {VARIANTS[m][0]} seed {seed}: schedule {cfg.method_config().stage_schedule}, "
                    f"{cfg.train.total_steps} updates -> {run_dir}")
                _share_before(out, methods, m, seed, run_dir)
                t0 = time.monotonic()
                try:
                    summary = asyncio.run(run(cfg, out_dir=run_dir, log=log))
                except Exception as e:  # noqa: BLE001  (one failed run, e.g. NoTrainableData, is reported; the sweep goes on)
                    failures.append({"method": m, "seed": seed, "error": f"{type(e).__name__}: {e}"})
                    log(f"ablate: {m} seed {seed} FAILED: {type(e).__name__}: {e} (rerun the command to retry it)")
                    run_dir.mkdir(parents=True, exist_ok=True)
                    (run_dir / "run_failed.json").write_text(json.dumps(failures[-1]) + "\n")
                    continue
                rec = {"method": m, "seed": seed, **run_record(run_dir, summary, time.monotonic() - t0)}
                rec_path.write_text(json.dumps(rec, indent=1) + "\n")
            records[m][seed] = json.loads(rec_path.read_text())
    records = {m: r for m, r in records.items() if r}
    agg = aggregate(records)
    title = f"Ablation: {', '.join(VARIANTS[m][0] for m in methods)} × seeds {', '.join(map(str, seeds))}"
    failed = "".join(f"\n- FAILED: {f['method']} seed {f['seed']}: {f['error']}" for f in failures)
    (out / "report.md").write_text(markdown(agg, title) + (f"\nRuns that failed (not in the tables):{failed}\n"
                                                           if failed else "") + "\n![comparison](comparison.png)\n")
    report = {"methods": list(methods), "seeds": list(seeds), "config": [*paths], "overrides": [*overrides],
              "per_method": agg, "runs": records, "failed": failures}
    (out / "report.json").write_text(json.dumps(report, indent=1, default=str) + "\n")
    plot(agg, records, out / "comparison.png")
    return report


def _share_before(out: Path, methods: Sequence[str], method: str, seed: int, run_dir: Path) -> None:
    """Copies the evaluation before training of another method's run of ``seed`` into ``run_dir`` (the same warm
    start, evaluation config and seed: the same measurement), so it runs once per seed, not once per run."""
    import shutil

    mine = run_dir / "eval_before"
    if (mine / "report.json").is_file():
        return
    for other in methods:
        theirs = out / other / f"seed{seed}" / "eval_before"
        if other != method and (theirs / "report.json").is_file():
            run_dir.mkdir(parents=True, exist_ok=True)
            shutil.copytree(theirs, mine, dirs_exist_ok=True)
            return
