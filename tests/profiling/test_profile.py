"""sera-profile: tools/gpu_profile.sh --tiny runs the train-step and decode-chunk profiles on CPU under jax.profiler;
the traces hold the profiled work and the reports hold their fields. The FLOP formulas and memory helper."""

from __future__ import annotations

import gzip
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from sera_jax.model import Qwen3Config
from sera_jax.profiling import decode_flops, peak_memory_bytes, trace_files, train_flops

ROOT = Path(__file__).resolve().parents[2]


def _result(line: str) -> dict[str, str]:
    return dict(kv.split("=", 1) for kv in line.split()[1:])


def _perfetto_text(trace_dir: Path) -> str:
    files = [f for f in trace_files(trace_dir) if f.name == "perfetto_trace.json.gz"]
    assert len(files) == 1, trace_files(trace_dir)
    text = gzip.decompress(files[0].read_bytes()).decode()
    json.loads(text)  # a whole JSON document Perfetto can load
    return text


@pytest.mark.slow
def test_gpu_profile_script_tiny_mode_traces_and_reports(tmp_path):
    env = dict(os.environ, PYTHON=sys.executable)
    env.pop("XLA_FLAGS", None)  # the script sets its own device count
    out = tmp_path / "prof"
    proc = subprocess.run(["bash", "tools/gpu_profile.sh", "--tiny", "--out", str(out)], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    results = [ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")]
    assert len(results) == 3, proc.stdout  # train, decode, combined (last)
    train, decode, both = (_result(r) for r in results)

    assert train["kind"] == "train" and train["mode"] == "tiny" and train["backend"] == "cpu"
    assert train["devices"] == "4" and train["skipped"] == "0"
    assert float(train["compile_s"]) > 0 and float(train["step_s"]) > 0 and int(train["tok_s"]) > 0
    assert int(train["tokens"]) > 0 and train["mfu"] == "na" and train["peak_mem_gib"] == "na"  # CPU: no peak
    assert decode["kind"] == "decode" and decode["new_compiles"] == "0"
    assert float(decode["chunk_s"]) > 0 and int(decode["tok_s"]) > 0 and decode["roofline"] == "na"
    assert both["train_step_s"] == train["step_s"] and both["decode_chunk_s"] == decode["chunk_s"]
    assert both["out"] == str(out)

    # The printed reports: every headline figure, the MFU formula, the CPU memory line.
    for name in ("compile (s)", "step time, median (s)", "tokens/s", "MFU", "peak device memory (GiB)",
                 "model TFLOP per step", "time per chunk (s)", "HBM roofline", "6·N·tokens + 6·L·H·E·Σ s²",
                 "2·N + 4·L·H·E·context", "n/a (backend reports no memory stats)"):
        assert name in proc.stdout, name

    # Traces: TensorBoard/XProf's xplane protobuf and a Perfetto JSON per run, holding the profiled work.
    for kind, marker in (("train", "train_step"), ("decode", "decode_chunk")):
        tdir = out / kind / "trace"
        names = [f.name for f in trace_files(tdir)]
        assert any(n.endswith(".xplane.pb") for n in names), names
        assert all(f.stat().st_size > 0 for f in trace_files(tdir))
        assert marker in _perfetto_text(tdir), f"no {marker} events in the {kind} trace"
        report = json.loads((out / kind / "report.json").read_text())
        assert report["kind"] == kind and report["trace_files"] == len(names) >= 2
    assert int(both["train_trace_files"]) >= 2 and int(both["decode_trace_files"]) >= 2


def test_profile_cli_refuses_full_mode_without_gpu(tmp_path):
    from sera_jax.cli.profile import main as profile_main

    assert profile_main(["--out", str(tmp_path / "x")]) == 2
    assert not (tmp_path / "x").exists()


def test_train_flops_formula():
    cfg = Qwen3Config.preset("qwen3-4b-instruct-2507")
    n = cfg.num_params()
    # 6·N per token, plus 6·L·H·E·s² of causal attention per sequence.
    attn = 6 * cfg.num_layers * cfg.num_heads * cfg.head_dim
    assert train_flops(cfg, [100, 50]) == pytest.approx(6 * n * 150 + attn * (100**2 + 50**2))
    # One 4096-token row of the 4B model: ~98 TFLOP of weights, attention ~ 16% on top.
    assert 1.0e14 < train_flops(cfg, [4096]) < 1.3e14
    # The head (V·D of N) only for the loss tokens: the trainer skips it for prompt tokens.
    head = cfg.vocab_size * cfg.hidden_size
    assert train_flops(cfg, [100, 50], loss_tokens=40) == pytest.approx(
        6 * (n - head) * 150 + 6 * head * 40 + attn * (100**2 + 50**2))
    assert train_flops(cfg, [100, 50], loss_tokens=150) == pytest.approx(train_flops(cfg, [100, 50]))
    with pytest.raises(ValueError, match="loss_tokens"):
        train_flops(cfg, [100], loss_tokens=101)


def test_decode_flops_formula():
    cfg = Qwen3Config.preset("tiny")
    n = cfg.num_params()
    per_pos = 4 * cfg.num_layers * cfg.num_heads * cfg.head_dim
    assert decode_flops(cfg, [10, 11, 12]) == pytest.approx(3 * 2 * n + per_pos * 33)
    assert decode_flops(cfg, []) == 0


class _Dev:
    def __init__(self, stats):
        self._stats = stats

    def memory_stats(self):
        if isinstance(self._stats, Exception):
            raise self._stats
        return self._stats


def test_peak_memory_bytes():
    import jax

    assert peak_memory_bytes(jax.devices()) is None  # CPU reports nothing
    assert peak_memory_bytes([_Dev({"peak_bytes_in_use": 5}), _Dev(None), _Dev({"peak_bytes_in_use": 9})]) == 9
    assert peak_memory_bytes([_Dev(RuntimeError("unsupported")), _Dev({})]) is None
