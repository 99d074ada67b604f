"""tools/bench_serve.py's quick mode runs end to end (4 openai-client users against a sera-serve process and the
engine alone, each on one core with the client on the other with ``--pin``) and ends in its RESULT line; its
numbers are reported by running the tool alone, not asserted here."""

import os

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.slow
def test_quick_mode_runs_and_reports():
    pin = ["--pin"] if len(os.sched_getaffinity(0)) >= 2 else []
    out = subprocess.run([sys.executable, str(ROOT / "tools" / "bench_serve.py"), "--quick", *pin],
                         capture_output=True, text=True, timeout=900, cwd=ROOT)
    assert out.returncode == 0, out.stderr[-3000:]
    result = [line for line in out.stdout.splitlines() if line.startswith("RESULT ")][-1]
    fields = dict(kv.split("=", 1) for kv in result.split()[1:])
    assert fields["users"] == "4" and fields["errors"] == "0" and fields["quick"] == "1"
    assert fields["pinned"] == str(len(pin)) and fields["top_logprobs"] == "5"
    assert float(fields["serve_tps"]) > 0 and float(fields["engine_tps"]) > 0 and float(fields["matmul_gflops"]) > 0
    assert "| sera-serve (openai client) |" in out.stdout and "| engine alone |" in out.stdout
