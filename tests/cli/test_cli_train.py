"""``sera-train --dry-run`` on the tiny CPU default: one real attempt at every stage of the SERA schedule (rollouts
with the engine and env workers, credit, batch, step) through the command line; config errors name the key."""

import json
import subprocess
import sys

import pytest


def _run(*args, timeout=900):
    return subprocess.run([sys.executable, "-c", "from sera_jax.cli.train import main; raise SystemExit(main())",
                           *args], capture_output=True, text=True, timeout=timeout)


def test_dry_run_passes_every_stage(tmp_path):
    out = _run("--dry-run", "--out", str(tmp_path / "run"), "rollout.max_completion_tokens=32")
    assert out.returncode == 0, out.stderr[-3000:]
    lines = [json.loads(line) for line in out.stdout.splitlines() if line.startswith("{")]
    assert [line["stage"] for line in lines[:3]] == ["execution", "delegation", "rubric_generation"]
    assert lines[-1]["dry_run"] == "ok"
    for line in lines[:3]:
        # each attempt ran task groups through the engine and the env workers
        assert line["groups_started"] >= 1 and line["time/rollout_s"] > 0
    records = [json.loads(x) for x in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [r["stage"] for r in records] == ["execution", "delegation", "rubric_generation"]
    # the builtin tokenizer is the shipped one, recorded with the run
    from sera_jax.assembly.tokenizer import SHIPPED
    meta = json.loads(next((tmp_path / "run" / "checkpoints").glob("*/meta/metadata")).read_text())
    assert meta["tokenizer_path"] == str(SHIPPED)


def test_config_error_names_the_key(tmp_path):
    out = _run("optim.lr=abc", "--out", str(tmp_path), timeout=300)
    assert out.returncode == 2 and "optim.lr" in out.stderr


@pytest.mark.slow
def test_default_run_end_to_end_shortened(tmp_path):
    """``sera-train`` with no config file, shortened: the shipped warm start copied into place, an evaluation on
    Easy validation tasks before and after, one SERA policy version, the learning curve and the summary."""
    out = _run("--out", str(tmp_path / "run"), f"model.init_from={tmp_path / 'ws'}", "train.total_steps=1", "train.warmup=false",
               "eval.num_tasks=3", "rollout.tasks_per_step=1", "rollout.speculative_groups_per_rank=1", timeout=1500)
    assert out.returncode == 0, out.stderr[-3000:]
    assert "shipped" in (out.stdout + out.stderr)
    run = tmp_path / "run"
    summary = json.loads((run / "summary.json").read_text())
    assert summary["versions"] == 1 and summary["eval_tasks"] == 3
    assert 0.0 <= summary["success_before"] <= 100.0 and 0.0 <= summary["success_after"] <= 100.0
    for phase in ("eval_before", "eval_after"):
        rep = json.loads((run / phase / "report.json").read_text())
        assert rep["num_tasks"] == 3 and list(rep["runs"][0]) == ["easy", "overall"]
    assert (run / "learning_curve.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    steps = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    assert any(not r["skipped_step"] for r in steps if r["kind"] == "step")


def test_ctrl_c_ends_with_a_resume_hint(tmp_path, monkeypatch, capsys):
    """SIGINT during a run (asyncio.run re-raises it as KeyboardInterrupt once the loop has saved on the way out)
    ends sera-train with status 130 and a line saying how to resume, not a traceback."""
    import sera_jax.cli.train as default_run
    from sera_jax.cli.train import main as train_main

    async def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(default_run, "run_default", interrupted)
    assert train_main(["--out", str(tmp_path / "run")]) == 130
    err = capsys.readouterr().err
    assert "interrupted" in err and str(tmp_path / "run") in err and "resumes" in err
