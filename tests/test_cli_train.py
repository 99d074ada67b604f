"""``sera-train --dry-run`` on the tiny CPU default: one real attempt at every stage of the SERA schedule (rollouts
with the engine and env workers, credit, batch, step) through the command line; config errors name the key."""

import json
import subprocess
import sys


def _run(*args, timeout=900):
    return subprocess.run([sys.executable, "-c", "from sera_jax.cli import train_main; raise SystemExit(train_main())",
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
    assert (tmp_path / "run" / "tokenizer.model").is_file()


def test_config_error_names_the_key(tmp_path):
    out = _run("optim.lr=abc", "--out", str(tmp_path), timeout=300)
    assert out.returncode == 2 and "optim.lr" in out.stderr
