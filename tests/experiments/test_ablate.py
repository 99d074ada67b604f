"""sera-ablate's plan: each method's schedule keeps the base config's number of updates, every run starts from the
shared warm start, and the report aggregates seeds (mean ± sample std) and costs against RAO."""

from __future__ import annotations

import dataclasses
import json

import numpy as np
import pytest

from sera_jax.config import load_config
from sera_jax.experiments.ablate import aggregate, markdown, method_schedule, plot, run_overrides, run_record


def test_method_schedules_keep_the_number_of_updates():
    base = "execution:6,delegation:1,rubric_generation:1"
    assert method_schedule(base, "keep") == base
    assert method_schedule(base, "drop:delegation") == "execution:7,rubric_generation:1"
    assert method_schedule(base, "drop:rubric_generation") == "execution:7,delegation:1"
    assert method_schedule(base, "execution:1") == "execution:1"
    assert method_schedule("delegation:2,rubric_generation:1", "drop:delegation") == \
        "execution:2,rubric_generation:1"


def test_run_overrides_make_a_loadable_config_per_method(tmp_path):
    base = load_config(["configs/tiny_cpu.yaml"])
    for method, name, schedule, sign in (("sera", "sera", "execution:6,delegation:1,rubric_generation:1", 1.0),
                                         ("rao", "rao", "execution:1", 1.0),
                                         ("sera_wo_d", "sera_wo_d", "execution:7,rubric_generation:1", 1.0),
                                         ("sera_rt_flipped", "sera", base.method_config().stage_schedule, -1.0),
                                         ("sera_sign_flipped", "sera", base.method_config().stage_schedule, 1.0)):
        over = run_overrides(base, method, 354, tmp_path / method, tmp_path / "warm")
        cfg = load_config(["configs/tiny_cpu.yaml"], over)
        mc = cfg.method_config()
        assert cfg.method.name == name and mc.stage_schedule == schedule and mc.rubric_advantage_sign == sign
        assert cfg.train.seed == 354 and cfg.model.init_from == str(tmp_path / "warm")
        assert not cfg.warmstart.enabled and cfg.train.total_steps == base.train.total_steps
        assert cfg.step.advantage_sign == (-1.0 if method == "sera_sign_flipped" else 1.0)
    assert load_config(["configs/tiny_cpu.yaml"], run_overrides(base, "rao", 1, tmp_path, tmp_path)) \
        .method_config().execution_reward == "rao"
    with pytest.raises(ValueError, match="unknown method"):
        run_overrides(base, "sera_plus", 1, tmp_path, tmp_path)
    # With the rubric probe on, every run ranks the ablation's one probe set.
    assert base.eval.rubric_probe_groups == 0 and not any("rubric_probe" in o for o in over)
    selfeval = load_config(["configs/tiny_selfeval.yaml"])
    over = run_overrides(selfeval, "rao", 1, tmp_path / "rao", tmp_path / "warm")
    assert load_config(["configs/tiny_selfeval.yaml"], over).eval.rubric_probe_set == \
        str(tmp_path / "rubric_probe_set.jsonl")


def _fake_run(tmp_path, name, before, after, acc, step_s, probe=None):
    d = tmp_path / name
    (d / "eval_after").mkdir(parents=True)
    (d / "eval_before").mkdir(parents=True)
    for when, value in zip(("before", "after"), probe or ()):
        (d / f"eval_{when}" / "rubric_probe.json").write_text(json.dumps(
            {"ranking_accuracy": value, "ranking_auc": value, "rubric_valid": 0.5, "ranked": 0.25}))
    (d / "eval_after" / "report.json").write_text(json.dumps({"tree_means": [{"delegations": 0.5}],
                                                               "num_tasks": 150}))
    rows = [{"kind": "step", "stage": "execution", "time/step_s": step_s, "delegation_rate": 0.5,
             "subagent_score_accuracy": 0.5, "supervision/judge_calls": 12.0,
             "supervision/execution_judge_calls": 12.0, "supervision/judge_labels": 11.0},
            {"kind": "step", "stage": "rubric_generation", "time/step_s": 2 * step_s, "delegation_rate": 1.0,
             "rubric_ranking_accuracy": acc[0], "rubric_ranking_auc": acc[0], "loss": 0.1, "grad_norm": 1.0,
             "ranked_groups": 1.0, "advantage_abs_max": 0.0, "supervision/judge_calls": 8.0,
             "supervision/judge_labels": 8.0},
            {"kind": "step", "stage": "rubric_generation", "time/step_s": 2 * step_s, "delegation_rate": 1.0,
             "rubric_ranking_accuracy": acc[1], "rubric_ranking_auc": acc[1], "loss": 0.3, "grad_norm": 3.0,
             "ranked_groups": 3.0, "advantage_abs_max": 0.05},
            {"kind": "step", "stage": "rubric_generation", "time/step_s": step_s, "skipped_step": True,
             "ranked_groups": 0.0}]  # a skipped attempt: timed, but not a trained rubric step
    (d / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return run_record(d, {"success_before": before, "success_after": after}, wall_s=100.0)


def test_report_aggregates_seeds_and_costs(tmp_path):
    recs = {"sera": {1: _fake_run(tmp_path, "s1", 20.0, 40.0, (0.5, 0.75), 10.0, probe=(0.4, 0.8)),
                     2: _fake_run(tmp_path, "s2", 22.0, 30.0, (0.25, 0.75), 10.0, probe=(0.5, 0.6))},
            "rao": {1: _fake_run(tmp_path, "r1", 20.0, 35.0, (None, None), 5.0)}}
    r = recs["sera"][1]
    assert r["rubric_ranking_accuracy_first"] == 0.5 and r["rubric_ranking_accuracy_last"] == 0.75
    assert r["rubric_loss"] == pytest.approx(0.2) and r["rubric_grad_norm"] == pytest.approx(2.0)
    assert r["step_s_by_stage"] == {"execution": 10.0, "rubric_generation": 50.0 / 3} and r["train_s"] == 60.0
    # two rubric steps trained, one of them with a non-zero advantage (a rubric gradient)
    assert r["rubric_steps_trained"] == 2 and r["rubric_steps_with_gradient"] == 1
    assert r["ranked_groups_per_rubric_step"] == 2.0
    assert r["probe_ranking_accuracy_before"] == 0.4 and r["probe_ranking_accuracy_after"] == 0.8
    # judge requests spent in training: all of them, and the sub-agent execution labels' share
    assert (r["judge_calls"], r["execution_judge_calls"], r["judge_labels"]) == (20.0, 12.0, 19.0)
    agg = aggregate(recs)
    mean, std = agg["sera"]["success_after"]
    assert mean == 35.0 and std == pytest.approx(np.std([40.0, 30.0], ddof=1))
    assert agg["sera"]["gain"][0] == pytest.approx(14.0)
    assert agg["sera"]["rubric_ranking_accuracy_first"][0] == pytest.approx(0.375)
    assert agg["sera"]["train_s_vs_rao"] == pytest.approx(60.0 / 30.0) and agg["rao"]["train_s_vs_rao"] == 1.0
    # the probe's change is the mean of per-seed differences (+0.4, +0.1), with their sample std
    assert agg["sera"]["probe_ranking_accuracy_gain"][0] == pytest.approx(0.25)
    assert agg["sera"]["probe_ranking_accuracy_gain"][1] == pytest.approx(np.std([0.4, 0.1], ddof=1))
    assert agg["rao"]["probe_ranking_accuracy_gain"] == (None, None)
    md = markdown(agg, "t")
    assert "| SERA | 2 |" in md and "**35.0 ± 7.1**" in md and "2.00×" in md
    assert "| SERA | 0.45 ± 0.07 → 0.70 ± 0.14 | 0.25 ± 0.21 |" in md
    assert "| 20 ± 0 | 12 ± 0 | 19 ± 0 |" in md  # judge calls, of which execution, labels
    assert "One evaluation of 150 tasks has a binomial sd of ±3.3 points at the 20.5% before training." in md
    plot(agg, recs, tmp_path / "c.png")
    assert (tmp_path / "c.png").stat().st_size > 0


def test_a_failed_run_is_reported_and_retried_not_fatal(tmp_path):
    from sera_jax.experiments.ablate import ablate
    from sera_jax.training.loop import NoTrainableData

    calls = []

    async def fails(cfg, out_dir, log):
        calls.append(cfg.method.name)
        raise NoTrainableData("20 skipped attempts in a row")

    rep = ablate(["configs/tiny_cpu.yaml"], [], ["sera", "rao"], [7], tmp_path, run=fails, log=lambda s: None)
    assert calls == ["sera", "rao"]  # the first failure did not stop the sweep
    assert [(f["method"], f["seed"]) for f in rep["failed"]] == [("sera", 7), ("rao", 7)]
    assert "NoTrainableData" in rep["failed"][0]["error"] and rep["runs"] == {}
    assert "FAILED: sera seed 7" in (tmp_path / "report.md").read_text()
    assert (tmp_path / "sera" / "seed7" / "run_failed.json").is_file()
    ablate(["configs/tiny_cpu.yaml"], [], ["sera"], [7], tmp_path, run=fails, log=lambda s: None)
    assert calls == ["sera", "rao", "sera"]  # not marked done: a rerun retries it


def test_rubric_grid_methods_and_their_spend_in_the_report(tmp_path):
    """The rubric-design grid: each method is SERA w/o D&RT with another writer/scorer; the report carries the
    per-role spend, the trajectory tokens and the external replies used."""
    from sera_jax.config.roles import backend
    from sera_jax.experiments.ablate import RUBRIC_GRID, needs_endpoint

    base = load_config(["configs/tiny_cpu.yaml"])
    want = {"sera_wo_d_rt": ("policy", "policy"), "kimi_rubric_policy_scorer": ("endpoint", "policy"),
            "kimi_rubric_kimi_scorer": ("endpoint", "endpoint"), "global_rubric_policy_scorer": ("file", "policy")}
    ref = load_config(["configs/tiny_cpu.yaml"], run_overrides(base, "sera_wo_d_rt", 1, tmp_path, tmp_path))
    for m in RUBRIC_GRID:
        cfg = load_config(["configs/tiny_cpu.yaml"], run_overrides(base, m, 1, tmp_path / m, tmp_path / "warm"))
        assert (backend(cfg, "rubric_writer"), backend(cfg, "scorer")) == want[m]
        assert cfg.method_config() == ref.method_config()  # the method itself is SERA w/o D&RT's
        # The tiny twin resolves to the same method and roles (its name aside).
        if m != "sera_wo_d_rt":
            twin = load_config([f"configs/tiny_{m}.yaml"])
            assert (backend(twin, "rubric_writer"), backend(twin, "scorer")) == want[m]
            assert twin.method_config() == dataclasses.replace(ref.method_config(), seed=twin.train.seed,
                                                               name=twin.method_config().name)
    assert needs_endpoint(["sera", "kimi_rubric_policy_scorer"]) and not needs_endpoint(
        ["sera_wo_d_rt", "global_rubric_policy_scorer"])

    def run(name, step_s, roles):
        d = tmp_path / name
        (d / "eval_after").mkdir(parents=True)
        rows = [{"kind": "step", "stage": "execution", "time/step_s": step_s, "completion_tokens": 100.0,
                 **{f"roles/{k}/{f}": v for k, fields in roles.items() for f, v in fields.items()}}] * 2
        (d / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
        return run_record(d, {"success_before": 10.0, "success_after": 20.0}, wall_s=50.0)

    pol = {"actor/policy": {"calls": 10, "prompt_tokens": 1000, "completion_tokens": 100, "failures": 0},
           "rubric_writer/policy": {"calls": 2, "prompt_tokens": 300, "completion_tokens": 40, "failures": 0}}
    ext = {"actor/policy": pol["actor/policy"],
           "rubric_writer/endpoint": {"calls": 3, "prompt_tokens": 450, "completion_tokens": 60, "failures": 1}}
    recs = {"sera_wo_d_rt": {1: run("p", 4.0, pol)}, "kimi_rubric_policy_scorer": {1: run("k", 5.0, ext)}}
    r = recs["kimi_rubric_policy_scorer"][1]
    assert r["roles"]["rubric_writer/endpoint"] == {"calls": 6.0, "prompt_tokens": 900.0, "completion_tokens": 120.0,
                                                    "failures": 2.0}
    assert (r["endpoint_calls"], r["endpoint_outputs_used"], r["trajectory_tokens"]) == (6.0, 4.0, 200.0)
    assert r["endpoint_calls_per_s"] == pytest.approx(6.0 / 10.0)
    agg = aggregate(recs)
    assert agg["kimi_rubric_policy_scorer"]["execution_step_s_added"] == pytest.approx(1.0)
    md = markdown(agg, "grid")
    assert "| Kimi rubric / policy scorer | rubric_writer/endpoint | 6 ± 0 | 900 ± 0 | 120 ± 0 | 2 ± 0 |" in md
    assert "| Kimi rubric / policy scorer | 200 ± 0 | 6 ± 0 | 4 ± 0 | 0.60 ± 0.00 | +1.0 |" in md
