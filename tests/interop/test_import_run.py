"""``sera-export --import HF_DIR RUN_DIR`` makes a run directory that the three readers of a run take as it is:
training's ``model.init_from``, ``sera-eval --checkpoint`` and ``sera-serve`` — each gets the HF weights."""

from __future__ import annotations

import json

import jax
import numpy as np

from sera_jax.cli.export import main as export_main
from sera_jax.config import load_config
from sera_jax.evaluation.protocol import load_policy
from sera_jax.model import load_pretrained
from sera_jax.serving.policy import load_served_policy
from sera_jax.training.build import initial_params_from_run
from sera_jax.warmstart.sft import SHIPPED_DIR


def _same(a, b) -> None:
    for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b), strict=True):
        np.testing.assert_array_equal(np.asarray(x, np.float32), np.asarray(y, np.float32))


def test_an_imported_run_loads_through_init_from_eval_and_serve(tmp_path, capsys):
    run = tmp_path / "imported"
    assert export_main([str(SHIPPED_DIR), str(run), "--import"]) == 0
    printed = json.loads(capsys.readouterr().out)
    assert printed == {"run": str(run), "checkpoint": str(run / "checkpoints"), "version": 0}
    assert sorted(p.name for p in run.iterdir()) == ["checkpoints"]
    _, hf = load_pretrained(SHIPPED_DIR, param_dtype="float32")

    cfg = load_config(["configs/tiny_cpu.yaml"], [f"model.init_from={run}"])
    _same(initial_params_from_run(cfg.model.init_from, cfg.model_config()), hf)  # sera-train model.init_from=RUN

    policy = load_policy(cfg, checkpoint=run)  # sera-eval --checkpoint RUN
    assert policy.source == f"checkpoint {run / 'checkpoints'} version 0"
    _same(policy.params, hf)
    assert load_policy(cfg).source == policy.source  # sera-eval under model.init_from=RUN

    served = load_served_policy(run)  # sera-serve RUN
    _same(served.params, hf)
    assert served.tokenizer.vocab_size == policy.tokenizer.vocab_size


def test_a_checkpoints_destination_is_written_as_that_folder_of_its_run(tmp_path):
    """The older spelling ``sera-export --import HF RUN/checkpoints`` makes the same run (not a
    RUN/checkpoints/checkpoints)."""
    assert export_main([str(SHIPPED_DIR), str(tmp_path / "run" / "checkpoints"), "--import"]) == 0
    assert (tmp_path / "run" / "checkpoints" / "0").is_dir()
    assert not (tmp_path / "run" / "checkpoints" / "checkpoints").exists()
