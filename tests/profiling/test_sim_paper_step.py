"""tools/sim_paper_step.py --tiny and sera-profile --simulate: a step of task groups on simulated GPUs reports the
host's figures, every one labelled simulated; an unknown GPU is a one-line error."""

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
ENV = {**os.environ, "JAX_PLATFORMS": "cpu"}


def test_tiny_simulated_step_reports_the_host_side(tmp_path):
    out = tmp_path / "step.json"
    r = subprocess.run([sys.executable, str(ROOT / "tools/sim_paper_step.py"), "--tiny", "--json", str(out)],
                       capture_output=True, text=True, env=ENV, timeout=240, cwd=ROOT)
    assert r.returncode == 0, r.stderr[-2000:]
    result = [line for line in r.stdout.splitlines() if line.startswith("RESULT ")]
    assert len(result) == 1 and result[0].startswith("RESULT simulated=h200 stage=execution processes=1 trees=4 ")
    rep = json.loads(out.read_text())
    assert rep["simulated"] == "h200" and rep["matmul_gflops"] > 0
    (p,) = rep["processes"]
    assert p["simulated"] == "h200" and p["trees"] == 4 and p["simulated_gpus"] == 2
    # The simulated devices did work, took less than the wall time, and the host did the rest.
    assert all(0 < b < p["rollout_wall_s"] for b in p["device_busy_s"])
    assert p["engine_calls"] > 4 and p["generated_tokens"] > 0 and p["cached_tokens"] > 0
    assert 0 < p["loop_busy_fraction"] <= 1 and p["host_us_per_token"] > 0
    assert p["host_cpu_s"]["env workers + sandboxes (live descendant processes)"] > 0 and p["datums"] > 0
    assert set(p["tree_shape"]) == set(p["assumed_tree_shape"]) and p["tree_shape"]["agents"] >= 1


def test_an_unknown_simulated_gpu_is_a_one_line_error():
    r = subprocess.run([sys.executable, "-m", "sera_jax.cli.profile", "--simulate", "a100", "configs/tiny_cpu.yaml"],
                       capture_output=True, text=True, env=ENV, timeout=120, cwd=ROOT)
    lines = [x for x in r.stderr.splitlines() if "error" in x]
    assert r.returncode == 2 and lines == ["config error: engine.simulate: unknown GPU target 'a100'; shipped: h100, h200"]
