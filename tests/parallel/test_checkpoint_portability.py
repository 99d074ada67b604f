"""Checkpoints do not care how many processes wrote them: a warm start written by one process restores into a
2-process × 2-device training mesh, a checkpoint those 2 processes save restores in one process (``sera-eval`` /
``sera-export``'s path), and the logits agree with the 2-process parameters'.

The workers are this file run as a script (``--worker``) under ``subprocess``, with bounded waits.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[2]
ASSET = ROOT / "sera_jax" / "assets" / "tiny_warmstart"
TIMEOUT_S = 300
TOKENS = [[1, 5, 9, 33, 2, 17, 101, 7, 64, 3, 250, 11, 12, 13, 14, 15]]


def _logits(params, cfg) -> np.ndarray:
    import jax
    import jax.numpy as jnp

    from sera_jax.model import forward

    tokens = jnp.asarray(TOKENS, jnp.int32)
    return np.asarray(jax.jit(lambda p: forward(p, cfg, tokens))(params), np.float64)


def _worker(mode: str, ws: str, two: str, port: int, pid: int) -> None:
    from sera_jax.parallel.hosts import start_distributed

    if mode == "two":
        os.environ.update(SERA_COORDINATOR=f"localhost:{port}", SERA_NUM_PROCESSES="2", SERA_PROCESS_ID=str(pid))
        assert start_distributed()
    import jax

    from sera_jax.model import Qwen3Config
    from sera_jax.parallel.mesh import MeshConfig, make_mesh
    from sera_jax.rl.optim import OptimConfig, make_optimizer
    from sera_jax.training.build import initial_params_from_run
    from sera_jax.training.checkpoint import Checkpointer
    from sera_jax.training.step import shard_train_state

    if mode == "two":
        assert jax.process_count() == 2 and jax.device_count() == 4
        cfg = Qwen3Config.preset("tiny-agent")
        mesh = make_mesh(MeshConfig(data=1, fsdp=-1, tensor=1))
        params = initial_params_from_run(ws, cfg, mesh=mesh)  # written by one process, read into both
        state = shard_train_state(params, make_optimizer(OptimConfig(lr=1e-3)), cfg, mesh)
        ck = Checkpointer(Path(two) / "checkpoints", every=1, keep=2)
        ck.save(3, state, {"model_config": __import__("dataclasses").asdict(cfg), "tokenizer_path": None},
                force=True)
        ck.close()
        # The 2-process parameters, gathered to this process's first device, through the same single-device program
        # as the one-process side: what is compared is the parameters (a sharded forward differs from an unsharded
        # one by its summation order alone, ~5e-6 here).
        from sera_jax.sampling.replicas import local_copy

        logits = _logits(local_copy(state.params), cfg)
    else:
        ck = Checkpointer(Path(two) / "checkpoints")
        cfg, params, meta = ck.restore_model()  # saved by two processes, read by one onto its first device
        ck.close()
        assert meta["version"] == 3
        logits = _logits(params, cfg)
    path = Path(two) / f"logits-{mode}-{jax.process_index()}.npy"
    np.save(path, logits)
    print("RESULT " + json.dumps({"process": jax.process_index(), "logits": str(path)}), flush=True)
    if mode == "two":
        from sera_jax.parallel.hosts import finish_distributed

        finish_distributed()


def _run(args: list[str], devices: int) -> subprocess.Popen:
    env = dict(os.environ, JAX_PLATFORMS="cpu", XLA_FLAGS=f"--xla_force_host_platform_device_count={devices}",
               PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    for k in ("SERA_COORDINATOR", "SERA_NUM_PROCESSES", "SERA_PROCESS_ID"):
        env.pop(k, None)
    return subprocess.Popen([sys.executable, __file__, "--worker", *args], cwd=ROOT, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _result(proc: subprocess.Popen, deadline: float) -> dict:
    try:
        out, err = proc.communicate(timeout=max(1.0, deadline - time.monotonic()))
    except subprocess.TimeoutExpired:
        proc.kill()
        raise AssertionError(f"a worker did not finish within {TIMEOUT_S} s") from None
    lines = [ln for ln in out.splitlines() if ln.startswith("RESULT ")]
    assert proc.returncode == 0 and lines, f"worker failed (rc {proc.returncode}):\n{out[-2000:]}\n{err[-4000:]}"
    return json.loads(lines[-1][len("RESULT "):])


@pytest.mark.slow
def test_one_process_warm_start_to_two_processes_and_back(tmp_path):
    ws, two = tmp_path / "ws", tmp_path / "two"
    subprocess.run([sys.executable, "-m", "sera_jax.cli.export", "--import", str(ASSET), str(ws / "checkpoints")],
                   cwd=ROOT, env=dict(os.environ, JAX_PLATFORMS="cpu"), check=True, capture_output=True,
                   timeout=TIMEOUT_S)
    with socket.socket() as s:
        s.bind(("localhost", 0))
        port = s.getsockname()[1]
    deadline = time.monotonic() + TIMEOUT_S
    procs = [_run(["two", str(ws), str(two), str(port), str(i)], 2) for i in range(2)]
    try:
        a, b = (_result(p, deadline) for p in procs)
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    one = _result(_run(["one", str(ws), str(two), "0", "0"], 1), time.monotonic() + TIMEOUT_S)
    la, lb, l1 = (np.load(r["logits"]) for r in (a, b, one))
    assert (a["process"], b["process"]) == (0, 1)
    np.testing.assert_array_equal(la, lb)  # both processes hold the same replicated logits
    assert np.abs(la).max() > 0.1          # a real model's logits, not zeros
    assert np.abs(la - l1).max() <= 1e-6, np.abs(la - l1).max()


if __name__ == "__main__" and len(sys.argv) == 7 and sys.argv[1] == "--worker":
    _worker(sys.argv[2], sys.argv[3], sys.argv[4], int(sys.argv[5]), int(sys.argv[6]))
