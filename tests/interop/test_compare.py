"""``sera-compare`` on the tiny default: every quantity within fp32 tolerance of PyTorch/transformers, a table and a
RESULT line; the exit code says pass (0), fail (1) or missing torch (3)."""

from __future__ import annotations

import pytest

import json
import subprocess
import sys
from pathlib import Path

import sera_jax.cli.compare as compare_mod
import sera_jax.interop.compare as interop_compare
from sera_jax.cli.compare import main as compare_main

ROOT = Path(__file__).resolve().parents[2]
ROWS = ["logits", "token_logprobs", "engine_logprobs", "engine_greedy_mismatches", "cispo_loss", "grad_norm",
        "grad_max_rel"]


@pytest.mark.slow
def test_sera_compare_passes_on_the_tiny_default(tmp_path):
    out = subprocess.run([sys.executable, "-c", "from sera_jax.cli.compare import main as compare_main; "
                          "raise SystemExit(compare_main())", "--json", str(tmp_path / "r.json")],
                         capture_output=True, text=True, timeout=600, cwd=ROOT)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    lines = out.stdout.splitlines()
    assert lines[-1].startswith("RESULT pass=1 ")
    result = dict(kv.split("=", 1) for kv in lines[-1].split()[1:])
    assert list(result) == ["pass"] + ROWS
    for name in ROWS:
        assert any(line.startswith(f"| {name} |") and line.endswith("| PASS |") for line in lines), name
    rep = json.loads((tmp_path / "r.json").read_text())
    rows = {r["name"]: r for r in rep["rows"]}
    assert rep["ok"] and rep["tol"] == 1e-4 and all(r["ok"] for r in rep["rows"])
    for name in ("logits", "token_logprobs", "engine_logprobs", "cispo_loss", "grad_norm", "grad_max_rel"):
        assert rows[name]["err"] <= 1e-4
    # the comparisons are not vacuous: real logit ranges, greedy tokens with logprobs well below 0, a non-zero
    # loss and gradient, and behaviour logprobs that push some ratios past CISPO's clip
    assert rows["logits"]["scale"] > 1.0 and rows["engine_logprobs"]["scale"] > 0.5
    assert rows["cispo_loss"]["scale"] > 0.1 and rows["grad_norm"]["scale"] > 0.1
    assert rows["engine_greedy_mismatches"]["max_err"] == 0
    assert rep["clipped_tokens"] > 0


def _fake_result(ok: bool) -> dict:
    err = 1e-7 if ok else 3e-3
    return {"source": "fake", "tol": 1e-4, "ok": ok, "clipped_tokens": 1,
            "rows": [{"name": "logits", "max_err": err, "scale": 1.0, "err": err, "tol": 1e-4, "ok": ok}]}


@pytest.mark.slow
def test_exit_code_and_table_report_a_failure(monkeypatch, capsys):
    monkeypatch.setattr(compare_mod, "compare", lambda **kw: _fake_result(False))
    assert compare_main([]) == 1
    out = capsys.readouterr().out
    assert "| logits | 3.000e-03 | 1.000e+00 | 3.000e-03 | 1e-04 | FAIL |" in out
    assert out.strip().splitlines()[-1] == "RESULT pass=0 logits=3.000e-03"
    monkeypatch.setattr(compare_mod, "compare", lambda **kw: _fake_result(True))
    assert compare_main([]) == 0


def test_missing_torch_is_a_clear_message(monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "torch", None)  # makes `import torch` raise ImportError
    assert compare_main([]) == 3
    err = capsys.readouterr().err
    assert "needs torch and transformers" in err and "pip install" in err


@pytest.mark.slow
def test_a_weight_mismatch_fails_the_comparison(monkeypatch, capsys):
    import sera_jax.model as model_mod

    real_save = model_mod.save_pretrained

    def perturbed_save(cfg, params, hf_dir, **kw):
        # the model torch loads gets a final norm 1% off; gradients are written unchanged
        if Path(hf_dir).name == "model":
            params = {**params, "final_norm": {"scale": params["final_norm"]["scale"] * 1.01}}
        return real_save(cfg, params, hf_dir, **kw)

    monkeypatch.setattr(interop_compare, "save_pretrained", perturbed_save)
    assert compare_main(["--seq-len", "32", "--new-tokens", "4"]) == 1
    lines = capsys.readouterr().out.splitlines()
    assert lines[-1].startswith("RESULT pass=0 ")
    failed = {line.split("|")[1].strip() for line in lines if line.endswith("| FAIL |")}
    assert {"logits", "token_logprobs", "engine_logprobs", "cispo_loss", "grad_norm"} <= failed
