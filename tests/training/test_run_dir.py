"""The run directory's mechanisms on their own (issue #48): the resume cut-back of metric lines, tree files and
TensorBoard events; the one-writer lock (a live holder refused by name, a dead one's lock taken over); the newest
intact checkpoint (a truncated newest version reported in one line, passed over, or refused)."""

import json
import os
import subprocess
import sys
from pathlib import Path

import jax
import jax.numpy as jnp
import pytest

from sera_jax.config import UserError
from sera_jax.model import Qwen3Config, init_params
from sera_jax.rl.optim import OptimConfig, make_optimizer
from sera_jax.training import checkpoint_sizes
from sera_jax.training.checkpoint import Checkpointer
from sera_jax.training.intact import CheckpointUnreadable, restore_newest_intact
from sera_jax.training.metrics import MetricsWriter, read_metrics
from sera_jax.training.resume import cut_back, finished_version, saved_version
from sera_jax.training.run_lock import LOCK_FILE, RunLock, RunLocked


def _write_run(out: Path, attempts: list[tuple[int, bool]]) -> None:
    """Writes the records of ``attempts`` (version attempted, skipped?) as the loop does: one step record and one
    tree file per attempt."""
    w = MetricsWriter(out)
    skipped = 0
    for v, skip in attempts:
        (out / "trees").mkdir(exist_ok=True)
        (out / "trees" / f"v{v:06d}_{skipped:04d}.jsonl").write_text("{}\n")
        w.write(v if skip else v + 1, "step", {"loss": float(v), "skipped_step": skip})
        skipped += skip
    w.close()


def _tb_steps(out: Path) -> list[int]:
    """Returns the steps of the ``step/loss`` scalars in the run's TensorBoard event files, in file order (TFRecord
    frames: 8-byte length, 4-byte crc, the Event proto, 4-byte crc)."""
    import struct

    from tensorboardX.proto.event_pb2 import Event

    steps = []
    for f in sorted((out / "tensorboard").glob("events.out.tfevents.*")):
        data, i = f.read_bytes(), 0
        while i < len(data):
            (n,) = struct.unpack("<Q", data[i:i + 8])
            ev = Event.FromString(data[i + 12:i + 12 + n])
            i += 12 + n + 4
            steps += [ev.step for v in ev.summary.value if v.tag == "step/loss"]
    return steps


def test_cut_back_keeps_exactly_the_checkpointed_attempts(tmp_path):
    # attempts: v0 ok, v1 skipped, v1 ok, v2 ok, v3 ok; a checkpoint at (version 2, skipped 1) holds the first 3
    _write_run(tmp_path, [(0, False), (1, True), (1, False), (2, False), (3, False)])
    with open(tmp_path / "metrics.jsonl", "a") as f:
        f.write('{"version": 5, "kin')  # a line torn by a kill mid-write
    cut = cut_back(tmp_path, 2, 1)
    assert [(r["version"], r["skipped_step"]) for r in read_metrics(tmp_path / "metrics.jsonl")] == [
        (1, False), (1, True), (2, False)]
    assert cut["metric_lines_dropped"] == 3 and cut["tensorboard_reset"]
    assert sorted(p.name for p in (tmp_path / "trees").iterdir()) == [
        "v000000_0000.jsonl", "v000001_0000.jsonl", "v000001_0001.jsonl"]
    assert not list((tmp_path / "tensorboard").glob("events*"))
    w = MetricsWriter(tmp_path)
    w.replay(cut["records"])
    w.write(3, "step", {"loss": 9.0, "skipped_step": False})  # the redone attempt
    w.close()
    assert _tb_steps(tmp_path) == [1, 1, 2, 3]
    # nothing to cut: nothing is rewritten
    assert cut_back(tmp_path, 3, 1)["metric_lines_dropped"] == 0


def test_cut_back_without_checkpoint_removes_every_record(tmp_path):
    _write_run(tmp_path, [(0, False), (1, False)])
    cut = cut_back(tmp_path, 0, 0)
    assert read_metrics(tmp_path / "metrics.jsonl") == [] and len(cut["tree_files_dropped"]) == 2


def test_saved_and_finished_versions(tmp_path):
    assert saved_version(tmp_path) is None
    for name in ("1", "3", "4.orbax-checkpoint-tmp-123"):
        (tmp_path / "checkpoints" / name).mkdir(parents=True)
    assert saved_version(tmp_path) == 3
    assert finished_version(tmp_path, 3) == 3 and finished_version(tmp_path, 4) is None
    assert finished_version(tmp_path, 3, needs=("summary.json",)) is None


_HOLD = "import sys, time; from sera_jax.training.run_lock import RunLock; RunLock(sys.argv[1], 'holder').acquire(); " \
        "print('held', flush=True); time.sleep(60)"


def test_a_live_holder_is_named_and_a_dead_ones_lock_taken_over(tmp_path):
    run = tmp_path / "run"
    holder = subprocess.Popen([sys.executable, "-c", _HOLD, str(run)], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        with pytest.raises(RunLocked, match=rf"pid {holder.pid} on host .* \(holder\)") as e:
            RunLock(run).acquire()
        assert isinstance(e.value, UserError)
    finally:
        holder.kill()
        holder.wait(timeout=30)
    # the holder died without releasing: its record stays, its flock went with it
    assert json.loads((run / LOCK_FILE).read_text())["pid"] == holder.pid
    warnings = []
    lock = RunLock(run, warn=warnings.append)
    previous = lock.acquire()
    assert previous["pid"] == holder.pid and "took over the stale lock" in warnings[0] and str(holder.pid) in warnings[0]
    assert json.loads((run / LOCK_FILE).read_text())["pid"] == os.getpid()
    lock.release()
    assert (run / LOCK_FILE).read_text() == ""  # released: emptied, never deleted
    again = RunLock(run, warn=warnings.append)
    assert again.acquire() is None and len(warnings) == 1
    again.release()


def test_a_lock_that_created_its_folder_removes_it_when_nothing_was_written(tmp_path):
    lock = RunLock(tmp_path / "new" / "run")
    lock.acquire()
    (tmp_path / "new" / "run" / "checkpoints").mkdir()
    lock.release()
    assert not (tmp_path / "new" / "run").exists()


CFG = Qwen3Config.preset("tiny", num_layers=1)


def _torn_run(tmp_path) -> tuple[Checkpointer, object]:
    tx = make_optimizer(OptimConfig(lr=1e-3, warmup_steps=0))
    from sera_jax.training.step import init_train_state

    state = init_train_state(init_params(jax.random.key(0), CFG), tx)
    ck = Checkpointer(tmp_path / "checkpoints", every=1, keep=3)
    for v in (1, 2, 3):
        ck.save(v, state.replace(step=jnp.asarray(v, jnp.int32)), {"model_config": {}})
    ck.wait()
    # the newest version's biggest params file cut short, as a full disk or an interrupted copy leaves it
    big = max((p for p in (tmp_path / "checkpoints" / "3" / "params").rglob("*") if p.is_file()),
              key=lambda p: p.stat().st_size)
    os.truncate(big, big.stat().st_size // 3)
    return ck, state


def test_a_finished_run_whose_newest_checkpoint_tore_since_is_not_finished(tmp_path):
    """The rerun of a finished run decides from names and recorded file sizes, without JAX: a newest version cut
    short after its save was recorded sends the rerun down the resume path (which reports it and falls back)."""
    ck, _ = _torn_run(tmp_path)  # versions 1-3 saved and recorded, then 3's biggest params file truncated
    ck.close()
    sizes = tmp_path / "checkpoints" / ".sizes"
    assert sorted(p.name for p in sizes.iterdir()) == ["1.json", "2.json", "3.json"]
    assert saved_version(tmp_path) == 3 and finished_version(tmp_path, 3) is None
    assert checkpoint_sizes.intact(tmp_path / "checkpoints", 2)
    (sizes / "3.json").unlink()  # no record (a run from before them): left to a real read, as before
    assert finished_version(tmp_path, 3) == 3
    # a version no longer kept loses its record; a missing file is as torn as a short one
    checkpoint_sizes.record(tmp_path / "checkpoints", [2, 3])
    assert sorted(p.name for p in sizes.iterdir()) == ["2.json", "3.json"]
    next(f for f in (tmp_path / "checkpoints" / "2").rglob("*") if f.is_file()).unlink()
    assert not checkpoint_sizes.intact(tmp_path / "checkpoints", 2)
    checkpoint_sizes.forget(tmp_path / "checkpoints", 2)  # what a save of version 2 does first
    assert checkpoint_sizes.intact(tmp_path / "checkpoints", 2) and not (sizes / "2.json").exists()


def test_a_torn_newest_checkpoint_is_reported_in_one_line_and_passed_over(tmp_path):
    ck, state = _torn_run(tmp_path)
    lines = []
    v, (restored, meta), torn = restore_newest_intact(
        ck.manager.all_steps(), lambda v: ck.restore(state, v), directory=str(ck.directory), log=lines.append)
    assert (v, int(restored.step), meta["version"], torn) == (2, 2, 2, [3])
    assert len(lines) == 1 and "\n" not in lines[0]
    assert lines[0].startswith("checkpoint version 3 is unreadable: ")
    assert str(ck.directory / "3" / "params") in lines[0] and lines[0].endswith("falling back to version 2")
    with pytest.raises(CheckpointUnreadable, match=r"version 3 is unreadable.*fallback refused.*\[2, 1\]"):
        restore_newest_intact(ck.manager.all_steps(), lambda v: ck.restore(state, v), directory=str(ck.directory),
                              fallback=False)
    ck.close()


def test_a_run_dir_of_another_architecture_is_a_users_mistake_not_a_torn_checkpoint(tmp_path):
    import dataclasses

    from sera_jax.training.intact import restore_same_architecture
    from sera_jax.training.step import init_train_state

    state = init_train_state(init_params(jax.random.key(0), CFG), make_optimizer(OptimConfig(lr=1e-3)))
    ck = Checkpointer(tmp_path / "checkpoints", every=1, keep=3)
    for v in (1, 2):
        ck.save(v, state, {"model_config": dataclasses.asdict(CFG)})
    ck.wait()
    ours = dataclasses.asdict(CFG)
    restored, meta = restore_same_architecture(ck, 2, state, ours)
    assert meta["version"] == 2
    other = {**ours, "hidden_size": 128}
    with pytest.raises(UserError, match="version 2 holds another architecture.*hidden_size: 64 vs 128"):
        restore_newest_intact(ck.manager.all_steps(), lambda v: restore_same_architecture(ck, v, state, other),
                              directory=str(ck.directory), log=pytest.fail)  # not reported as torn
    ck.close()
