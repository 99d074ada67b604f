"""tools/bench_served_eval.py runs end to end on one task (the tiny default's policy evaluated in process and through
a sera-serve process of the same weights) and ends in its RESULT line; its numbers are reported by running the tool
alone, not asserted here."""

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.slow
def test_one_task_two_ways(tmp_path):
    out = subprocess.run([sys.executable, str(ROOT / "tools" / "bench_served_eval.py"), "--tasks", "1",
                          "--out", str(tmp_path)], capture_output=True, text=True, timeout=900, cwd=ROOT)
    assert out.returncode == 0, out.stderr[-3000:]
    result = [line for line in out.stdout.splitlines() if line.startswith("RESULT ")][-1]
    fields = dict(kv.split("=", 1) for kv in result.split()[1:])
    assert fields["tasks"] == "1" and fields["outcomes_equal"] in ("0/1", "1/1")
    assert float(fields["in_process_s"]) > 0 and float(fields["endpoint_s"]) > 0 and float(fields["matmul_gflops"]) > 0
    assert fields["prompt_mismatch_turns"] == "0"  # the server counted every prompt as the trees record it
    # both passes' reports are kept, and the served one counted its tokens from the server's usage
    assert (tmp_path / "in_process" / "report.json").is_file() and (tmp_path / "endpoint" / "report.json").is_file()
    usage = next(x for x in out.stdout.splitlines() if x.startswith("completion tokens (usage)"))
    assert int(usage.split()[-1]) > 0
