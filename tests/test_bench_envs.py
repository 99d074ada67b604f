"""tools/bench_envs.py runs each environment's benchmark (its own table and RESULT line) or both in one table, from
any directory (the tool imports the installed packages; its numbers are the README's, not a test's)."""

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
KEYS = {
    "textcraft": {"tool_calls_per_s", "cells_per_s", "fork_us", "commit_us", "sandbox_start_ms"},
    "textworld": {"tw_actions_per_s", "tw_async_actions_per_s", "tw_fork_easy_us", "tw_fork_extreme_us",
                  "tw_commit_us", "tw_digest_us", "tw_actions_target_met", "tw_fork_target_met"},
}


@pytest.mark.parametrize("env", ["textcraft", "textworld", "both"])
def test_bench_envs_reports_its_result_line(env, tmp_path):
    out = subprocess.run([sys.executable, str(ROOT / "tools" / "bench_envs.py"), "--env", env, "--quick"],
                         capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert out.returncode == 0, out.stderr[-2000:]
    last = out.stdout.strip().splitlines()[-1]
    assert last.startswith("RESULT ") and out.stdout.count("RESULT ") == 1
    result = dict(kv.split("=") for kv in last.split()[1:])
    if env == "both":
        assert len(result) == 12 and "all_targets_met" in result
        assert sum(k.startswith("textcraft_") for k in result) == 5
        assert sum(k.startswith("textworld_") for k in result) == 6
    else:
        assert set(result) == KEYS[env]
