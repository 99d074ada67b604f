"""The TextWorld-Sync benchmark (``tools/bench_envs.py --env textworld``) runs and reports rows in the shared format."""

import importlib.util
from pathlib import Path

BENCH = Path(__file__).resolve().parents[2] / "tools" / "bench_envs.py"


def test_bench_quick_rows():
    spec = importlib.util.spec_from_file_location("bench_envs", BENCH)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    rows = module.textworld_rows(quick=True)
    assert all(set(r) == {"metric", "ours", "target", "unit"} for r in rows)
    by_metric = {r["metric"]: r for r in rows}
    fork = by_metric["textworld fork, easy task"]
    assert 0 < fork["ours"] <= fork["target"] == 50.0
    actions = by_metric["textworld actions/s/core (World.step, observed)"]
    assert actions["ours"] > 0 and actions["target"] == 20_000
