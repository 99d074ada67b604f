"""tools/gpu_kernels.sh --tiny runs end to end (CPU, interpret mode) and reports correct results; and, on a GPU, the
compiled (not interpreted) kernels equal their references."""

import os
import re
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_tiny_benchmark_runs_and_reports_correct_kernels():
    env = dict(os.environ, PYTHON=sys.executable)
    proc = subprocess.run(["bash", os.path.join(ROOT, "tools", "gpu_kernels.sh"), "--tiny"], capture_output=True,
                          text=True, env=env, timeout=300, cwd=ROOT)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    result = [line for line in proc.stdout.splitlines() if line.startswith("RESULT ")]
    assert len(result) == 1, proc.stdout
    fields = dict(re.findall(r"(\w+)=(\S+)", result[0]))
    assert fields["correct"] == "1" and fields["tiny"] == "1"
    for key in ("decode_kernel_ms", "decode_ref_ms", "decode_TBps", "flash_fwdbwd_ms", "flash_fwdbwd_TFLOPs"):
        assert float(fields[key]) > 0, key
    assert float(fields["decode_err"]) < 1e-4 and float(fields["flash_err"]) < 1e-4


@pytest.mark.skipif(jax.default_backend() != "gpu", reason="needs a GPU: compiled Triton kernels (CPU runs them "
                                                            "in interpret mode in the other tests)")
def test_compiled_kernels_match_references_on_gpu():
    from sera_jax.kernels import flash_attention
    from sera_jax.model.qwen3 import dense_attention
    sys.path.insert(0, os.path.join(ROOT, "tools"))
    import bench_kernels
    assert bench_kernels.bench_decode(tiny=False, iters=1, interpret=False)["decode_err"] < 2e-2
    rng = np.random.default_rng(0)
    q, ct = (jnp.asarray(rng.normal(size=(2, 300, 8, 64)), jnp.bfloat16) for _ in range(2))
    k, v = (jnp.asarray(rng.normal(size=(2, 300, 2, 64)), jnp.bfloat16) for _ in range(2))
    seg = jnp.asarray(np.repeat([[1, 2, 3, 0]], 75, axis=1).reshape(1, 300).repeat(2, 0), jnp.int32)

    def out_and_grads(fn):
        out, vjp = jax.vjp(fn, q, k, v)
        return (out, *vjp(ct))

    got = jax.jit(lambda: out_and_grads(lambda q, k, v: flash_attention(q, k, v, seg, interpret=False)))()
    want = jax.jit(lambda: out_and_grads(lambda q, k, v: dense_attention(q, k, v, None, {"segment_ids": seg})[0]))()
    for a, b in zip(got, want):
        np.testing.assert_allclose(np.asarray(a, np.float32), np.asarray(b, np.float32), atol=6e-2, rtol=6e-2)
