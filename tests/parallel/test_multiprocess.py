"""Multi-host training on CPU: 2 processes × 4 devices (``jax.distributed`` on localhost, gloo collectives) run the
sharded train step over one mesh spanning both processes and agree with 1 process × 8 devices.

The test starts its workers with ``subprocess`` (this file run as a script in ``--worker`` mode), bounds every wait
with a timeout, and kills whatever is left of its own processes on the way out.
"""

from __future__ import annotations

import pytest

import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
TIMEOUT_S = 150


def _host_params(cfg):
    """Returns random parameters as numpy arrays (seed 0): norm scales near 1, weights N(0, 0.05²).

    Built on the host from the abstract shapes: flax's init would compile a program per process (~10 s on CPU)."""
    import jax

    from sera_jax.model import abstract_params

    rng = np.random.default_rng(0)

    def leaf(path, a):
        scale = "scale" in jax.tree_util.keystr(path)
        x = (1.0 + 0.1 * rng.standard_normal(a.shape)) if scale else 0.05 * rng.standard_normal(a.shape)
        return x.astype(a.dtype)

    return jax.tree_util.tree_map_with_path(leaf, abstract_params(cfg))


def _worker(num_processes: int, process_id: int, port: int) -> None:
    """Runs two sharded train steps on the tiny model and prints one JSON line of metrics and checksums."""
    import jax

    jax.config.update("jax_cpu_collectives_implementation", "gloo")
    from sera_jax.parallel import MeshConfig, initialize_distributed, make_mesh

    if num_processes > 1:
        assert initialize_distributed(f"localhost:{port}", num_processes, process_id)
    import jax.numpy as jnp
    from jax.sharding import NamedSharding, PartitionSpec

    from sera_jax.model import Qwen3Config
    from sera_jax.rl.batch import pack_datums
    from sera_jax.rl.datums import Datum
    from sera_jax.rl.optim import OptimConfig, make_optimizer
    from sera_jax.training.step import batch_axis_size, make_train_step, shard_train_state, stack_micro_batches

    cfg = Qwen3Config.preset("tiny")
    assert jax.device_count() == 8 and jax.local_device_count() == 8 // num_processes
    # Data across the 2 hosts, fsdp within each: the multi-host path is make_mesh's dcn_data layout (processes are
    # the slow-axis granules); the 1-process reference orders its 8 devices the same way.
    devices = sorted(jax.devices(), key=lambda d: (d.process_index, d.id))
    mesh = make_mesh(MeshConfig(data=2, fsdp=4, tensor=1, dcn_data=num_processes), devices=devices)
    params = _host_params(cfg)  # the same host copy in every process
    tx = make_optimizer(OptimConfig(lr=1e-3, warmup_steps=0))

    rng = np.random.default_rng(0)
    datums = []
    for _ in range(12):
        n = int(rng.integers(10, 40))
        prompt = int(rng.integers(2, n - 2))
        logp = np.concatenate([[0.0], -np.log(cfg.vocab_size) + rng.normal(0, 0.7, n - 1)])
        datums.append(Datum(tokens=tuple(int(t) for t in rng.integers(0, cfg.vocab_size, n)),
                            mask=(0,) * prompt + (1,) * (n - prompt), logprobs=tuple(float(x) for x in logp),
                            versions=(0,) * n, reward=0.0, advantage=float(rng.normal()), objective="execution",
                            traj_depth=0, traj_start=1))
    packed = pack_datums(datums, token_budget=256, row_len=64)
    host_batch = stack_micro_batches(packed.micro_batches, row_multiple=batch_axis_size(mesh))

    state = shard_train_state(params, tx, cfg, mesh)
    step = make_train_step(cfg, tx, mesh=mesh, state=state)
    # A global array from the host copy each process holds: every process fills only its addressable shards.
    batch = jax.tree.map(lambda x, sh: jax.make_array_from_callback(x.shape, sh, lambda idx: np.asarray(x)[idx]),
                         host_batch, step.batch_sharding)
    metrics = []
    for _ in range(2):
        state, m = step(state, batch)
        metrics.append({k: float(v) for k, v in m.items()})
    replicated = NamedSharding(mesh, PartitionSpec())
    checks = jax.jit(lambda p: {
        "param_sum": sum(jnp.sum(x) for x in jax.tree.leaves(p)),
        "param_sq": sum(jnp.sum(x * x) for x in jax.tree.leaves(p)),
        # a position-weighted sum, so entries trading places would not cancel out
        "param_weighted": sum(jnp.sum(x.reshape(-1) * jnp.cos(jnp.arange(x.size, dtype=jnp.float32)))
                              for x in jax.tree.leaves(p)),
    }, out_shardings=replicated)(state.params)
    out = {"process": jax.process_index(), "processes": jax.process_count(), "step": int(state.step),
           "metrics": metrics, **{k: float(v) for k, v in checks.items()},
           "device_layout": [[d.process_index for d in row.reshape(-1)] for row in mesh.devices]}
    print("RESULT " + json.dumps(out), flush=True)
    if num_processes > 1:
        jax.distributed.shutdown()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("localhost", 0))
        return s.getsockname()[1]


def _start(num_processes: int, process_id: int, port: int, devices: int) -> subprocess.Popen:
    # Backend optimisation level 0 saves ~30% of each process's compile time; all three processes use it.
    flags = f"--xla_force_host_platform_device_count={devices} --xla_backend_optimization_level=0"
    env = dict(os.environ, JAX_PLATFORMS="cpu", XLA_FLAGS=flags,
               PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    return subprocess.Popen([sys.executable, __file__, "--worker", str(num_processes), str(process_id), str(port)],
                            cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _result(proc: subprocess.Popen, deadline: float, name: str) -> dict:
    try:
        out, err = proc.communicate(timeout=max(1.0, deadline - time.monotonic()))
    except subprocess.TimeoutExpired:
        raise AssertionError(f"{name} did not finish within {TIMEOUT_S} s") from None
    lines = [ln for ln in out.splitlines() if ln.startswith("RESULT ")]
    assert proc.returncode == 0 and lines, f"{name} failed (rc {proc.returncode}):\n{out[-3000:]}\n{err[-5000:]}"
    return json.loads(lines[-1][len("RESULT "):])


@pytest.mark.slow
def test_two_processes_equal_one_process():
    port = _free_port()
    procs = {"process 0 of 2": _start(2, 0, port, 4), "process 1 of 2": _start(2, 1, port, 4),
             "single process": _start(1, 0, 0, 8)}
    deadline = time.monotonic() + TIMEOUT_S
    try:
        res = {name: _result(p, deadline, name) for name, p in procs.items()}
    finally:
        for p in procs.values():  # only the processes this test started
            if p.poll() is None:
                p.kill()
                p.wait(timeout=10)
    a, b, ref = res["process 0 of 2"], res["process 1 of 2"], res["single process"]
    assert (a["processes"], b["processes"], ref["processes"]) == (2, 2, 1)
    # the mesh really spans both processes: host 0 holds data row 0, host 1 data row 1
    assert a["device_layout"] == [[0, 0, 0, 0], [1, 1, 1, 1]]
    assert a["step"] == ref["step"] == 2
    for key in ("param_sum", "param_sq", "param_weighted"):
        assert a[key] == b[key]  # every process sees the same replicated values
        np.testing.assert_allclose(a[key], ref[key], rtol=1e-5, atol=1e-5, err_msg=key)
    for m2, m1 in zip(a["metrics"], ref["metrics"]):
        assert m2["skipped"] == m1["skipped"] == 0.0 and m2["tokens"] == m1["tokens"] > 0
        for key in ("loss", "grad_norm", "update_norm", "clip_frac", "mean_ratio"):
            np.testing.assert_allclose(m2[key], m1[key], rtol=1e-5, atol=1e-6, err_msg=key)
    assert a["metrics"][1]["loss"] != a["metrics"][0]["loss"]  # the first step changed the weights


if __name__ == "__main__" and len(sys.argv) == 5 and sys.argv[1] == "--worker":
    _worker(int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]))
