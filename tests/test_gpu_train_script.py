"""tools/gpu_train.sh --tiny: the H200 profiling script's code path (FSDP over 4 CPU devices) runs and reports."""

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_gpu_train_script_tiny_mode_runs_and_reports():
    env = dict(os.environ, PYTHON=sys.executable)
    env.pop("XLA_FLAGS", None)  # the script sets its own device count
    proc = subprocess.run(["bash", "tools/gpu_train.sh", "--tiny"], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=150)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    result = [ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")]
    assert len(result) == 1, proc.stdout
    fields = dict(kv.split("=", 1) for kv in result[0].split()[1:])
    assert fields["mode"] == "tiny" and fields["backend"] == "cpu" and fields["devices"] == "4"
    assert int(fields["tokens"]) > 0 and float(fields["step_s"]) > 0 and int(fields["tok_s"]) > 0
    assert fields["skipped"] == "0"
    for name in ("step time, median (s)", "tokens/s", "MFU", "peak device memory (GiB)", "model TFLOP per step"):
        assert name in proc.stdout
