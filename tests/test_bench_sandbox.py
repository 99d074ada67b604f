"""tools/bench_sandbox.py runs and reports both ways of starting a sandbox (its numbers are docs/results/sandbox.md's,
not a test's)."""

import subprocess
import sys
from pathlib import Path

import pytest

from envs_py.sandbox import Zygote

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.skipif(not Zygote.available(), reason="the zygote needs Linux pidfds (os.pidfd_open)")
def test_bench_sandbox_reports_both_ways():
    out = subprocess.run([sys.executable, str(ROOT / "tools" / "bench_sandbox.py"), "--n", "2"], capture_output=True,
                         text=True, timeout=300, cwd=ROOT)
    assert out.returncode == 0, out.stderr[-2000:]
    result = dict(kv.split("=") for kv in out.stdout.strip().splitlines()[-1].split()[1:])
    assert set(result) == {"n", "own_cpu_ms", "fork_cpu_ms", "own_wall_ms", "fork_wall_ms", "zygote_cpu_ms",
                           "cell_rt_ms", "call_rt_us", "matmul_gflops"}
    assert result["n"] == "2" and all(float(v) >= 0 for v in result.values())
    assert "own interpreter" in out.stdout and "fork of the zygote" in out.stdout
