"""tools/bench_decode.py's headline case runs end to end (a smoke run: 3 agents of the recorded workload) and ends in
its RESULT line; its numbers are reported by running the tool alone, not asserted here."""

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.slow
def test_workload_case_runs_and_reports():
    out = subprocess.run([sys.executable, str(ROOT / "tools" / "bench_decode.py"), "--only", "workload", "--quick",
                          "--agents", "3"], capture_output=True, text=True, timeout=900, cwd=ROOT)
    assert out.returncode == 0, out.stderr[-3000:]
    result = [line for line in out.stdout.splitlines() if line.startswith("RESULT ")][-1]
    fields = dict(kv.split("=", 1) for kv in result.split()[1:])
    assert fields["workload_agents"] == "3" and float(fields["workload_engine_tps"]) > 0
    assert float(fields["workload_hf_tps"]) > 0 and float(fields["workload_ratio"]) > 0
