"""sera-ablate end to end on the tiny config: two methods × one seed × one update, the report, and a rerun that
reruns nothing."""

from __future__ import annotations

import json

import pytest

from sera_jax.cli.ablate import main
from sera_jax.experiments import ablate as ablate_mod


@pytest.mark.slow
def test_two_methods_one_seed_one_step(tmp_path, monkeypatch):
    out = tmp_path / "ab"
    args = ["train.total_steps=1", "train.warmup=false", "eval.num_tasks=4", "rollout.speculative_groups_per_rank=0",
            f"warmstart.out_dir={tmp_path / 'unused'}", "eval.rubric_probe_groups=2", "eval.rubric_probe_samples=1",
            "--methods", "sera,rao", "--seeds", "353", "--out", str(out)]
    assert main(args) == 0
    report = json.loads((out / "report.json").read_text())
    assert set(report["per_method"]) == {"sera", "rao"}
    for m in ("sera", "rao"):
        rec = report["runs"][m]["353"]
        assert rec["attempts"] - rec["skipped"] == 1 and 0 <= rec["success_after"] <= 100 and rec["wall_s"] > 0
        assert (out / m / "seed353" / "summary.json").is_file()
    # One warm start (the shipped one, copied), shared; the evaluation before training ran once for the seed.
    assert (out / "warmstart" / "checkpoints").is_dir()
    assert report["runs"]["sera"]["353"]["success_before"] == report["runs"]["rao"]["353"]["success_before"]
    assert (out / "comparison.png").stat().st_size > 0 and "| RAO | 1 |" in (out / "report.md").read_text()
    # The rubric probe: one set of 2 mixed held-out fork groups, collected once by the warm start, ranked before and
    # after by every run (the "before" shared with the evaluation); its numbers are in the records and the report.
    assert (out / "rubric_probe_set.jsonl").is_file() and not (out / "sera" / "seed353" / "rubric_probe_set.jsonl").exists()
    for m in ("sera", "rao"):
        rec = report["runs"][m]["353"]
        assert 0 <= rec["probe_rubric_valid_before"] <= 1 and 0 <= rec["probe_rubric_valid_after"] <= 1
        probe = json.loads((out / m / "seed353" / "eval_after" / "rubric_probe.json").read_text())
        assert probe["groups"] == 2 and probe["version"] == 1 and probe["set"] == str(out / "rubric_probe_set.jsonl")
    assert report["runs"]["sera"]["353"]["probe_rubric_valid_before"] == \
        report["runs"]["rao"]["353"]["probe_rubric_valid_before"]
    assert "The rubric probe" in (out / "report.md").read_text()

    # Resumable: a second invocation reruns no finished run.
    def boom(*a, **k):
        raise AssertionError("a finished run was rerun")

    monkeypatch.setattr("sera_jax.experiments.default_run.run_default", boom)
    report2 = ablate_mod.ablate(["configs/tiny_cpu.yaml"], args[:6], ["sera", "rao"], [353], out, run=boom)
    assert report2["runs"]["sera"][353] == report["runs"]["sera"]["353"]


def test_bad_method_is_refused(tmp_path, capsys):
    assert main(["--methods", "sera,nope", "--out", str(tmp_path)]) == 2
    assert "nope" in capsys.readouterr().err
