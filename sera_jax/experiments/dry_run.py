"""``sera-train --dry-run``: one real attempt at each stage of a config's schedule, in a fresh directory.

A dry run checks the machinery (rollouts, credit, the step, a checkpoint), not the policy: it never spends minutes
building a warm start, and starts from random weights when the configured one is not built yet.
"""

from __future__ import annotations

import dataclasses
import sys
import tempfile
from pathlib import Path
from typing import Callable

import jax

from sera_jax.config import RunConfig
from sera_jax.rl.stages import parse_schedule
from sera_jax.training.build import build_loop
from sera_jax.training.loop import StepOutcome


def without_missing_warm_start(cfg: RunConfig) -> RunConfig:
    """Returns ``cfg`` with ``model.init_from`` cleared when it names a run directory with no checkpoints yet."""
    init = cfg.model.init_from
    if init is not None and not (Path(init) / "checkpoints").is_dir():
        print(f"dry run: no warm start in {init}; starting from random weights", file=sys.stderr)
        return dataclasses.replace(cfg, model=dataclasses.replace(cfg.model, init_from=None))
    return cfg


async def dry_run(cfg: RunConfig, *, out_dir: str | Path | None = None,
                  on_step: Callable[[StepOutcome], None] | None = None) -> list[StepOutcome]:
    """Runs one attempt at the first version of each stage of the schedule and saves a checkpoint; returns the
    attempts' outcomes in schedule order. No warm-up (``train.warmup``): three attempts use few of the shapes it
    would compile, and each compiles on first use instead."""
    cfg = without_missing_warm_start(cfg)
    cfg = dataclasses.replace(cfg, train=dataclasses.replace(cfg.train, warmup=False))
    if out_dir is None and jax.process_count() > 1:
        raise ValueError("a multi-process dry run needs --out DIR, a directory every process sees")
    out = out_dir or tempfile.mkdtemp(prefix="sera-dry-run-")
    async with build_loop(cfg, out_dir=out) as loop:
        outcomes = []
        start = 0
        for _stage, length in parse_schedule(loop.method.stage_schedule):
            loop.version = start  # the first version of this stage
            o = await loop.step()
            if on_step is not None:
                on_step(o)
            outcomes.append(o)
            start += length
        # The checkpoint path is part of the machinery: save once whatever the attempts did (an attempt that found
        # no trainable batch advances no version, so no periodic save need have happened).
        loop.save(force=True)
        loop.checkpointer.wait()
        return outcomes
