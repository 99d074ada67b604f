"""A user's mistake is one line (issue #48): ``PROG: error: …`` (or ``config error: …`` naming the file and line)
on stderr, exit 2, no traceback, and no output folder left behind."""

import pytest

from sera_jax.cli import eval as eval_cli
from sera_jax.cli import export as export_cli
from sera_jax.cli import train as train_cli
from sera_jax.cli import view as view_cli


def _one_line(capsys) -> str:
    err = [x for x in capsys.readouterr().err.splitlines() if x.strip()]
    assert len(err) == 1, err
    assert "Traceback" not in err[0]
    return err[0]


def test_yaml_syntax_error_names_the_file_and_line(tmp_path, capsys):
    bad = tmp_path / "bad.yaml"
    bad.write_text("name: x\ntrain:\n  total_steps: 3\n  seed: [1\n")
    assert train_cli.main([str(bad), "--out", str(tmp_path / "out")]) == 2
    line = _one_line(capsys)
    assert line.startswith(f"config error: config: {bad}:5:1: YAML syntax: ") and "<unicode string>" not in line
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("argv, prog, says", [
    (lambda t: ["--checkpoint", "/nonexistent", "--out", str(t / "out")], eval_cli, "sera-eval: error: no run or "
     "checkpoint directory at /nonexistent"),
    (lambda t: ["--checkpoint", str(t / "run"), "--out", str(t / "out")], eval_cli, "sera-eval: error: no checkpoint "
     "in {t}/run/checkpoints"),
    (lambda t: ["/nonexistent", str(t / "out")], export_cli, "sera-export: error: no run or checkpoint directory at "
     "/nonexistent"),
    (lambda t: [str(t / "run"), str(t / "out")], export_cli, "sera-export: error: no checkpoint in {t}/run/checkpoints"),
    (lambda t: ["/nonexistent.jsonl", "-o", str(t / "out" / "r.html")], view_cli, "sera-view: error: no tree file at "
     "/nonexistent.jsonl"),
    (lambda t: ["warmstart.enabled=false", "model.init_from=/nonexistent", "--out", str(t / "out")], train_cli,
     "sera-train: error: model.init_from: no checkpoints in /nonexistent"),
    (lambda t: ["warmstart.enabled=false", f"model.init_from={t / 'run'}", "--out", str(t / "out")], train_cli,
     "sera-train: error: no checkpoint in {t}/run/checkpoints"),
], ids=["eval-missing", "eval-empty-checkpoints", "export-missing", "export-empty-checkpoints", "view-missing",
        "train-init-from-missing", "train-init-from-empty"])
def test_missing_paths_and_empty_checkpoints(tmp_path, capsys, argv, prog, says):
    (tmp_path / "run" / "checkpoints").mkdir(parents=True)  # a run directory without any checkpoint
    assert prog.main(argv(tmp_path)) == 2
    assert _one_line(capsys).startswith(says.format(t=tmp_path))
    assert not (tmp_path / "out").exists()
