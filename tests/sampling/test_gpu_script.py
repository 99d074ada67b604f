"""CI coverage of the GPU decode benchmark script: its --tiny mode runs end to end on CPU."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_gpu_decode_tiny_runs_and_reports():
    env = {**os.environ, "PYTHON": sys.executable, "JAX_PLATFORMS": "cpu"}
    env.pop("XLA_FLAGS", None)  # one CPU device, as on a plain CI machine
    proc = subprocess.run(["bash", str(ROOT / "tools" / "gpu_decode.sh"), "--tiny"], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    result = [line for line in proc.stdout.splitlines() if line.startswith("RESULT ")]
    assert len(result) == 1, proc.stdout[-3000:]
    fields = dict(kv.split("=") for kv in result[0].split()[1:])
    for key in ("b1_tps", "b4_tps", "b8_tps", "b1_roofline_pct"):
        assert float(fields[key]) > 0, fields
    assert fields["tiny"] == "1" and fields["new_compiles"] == "0"
