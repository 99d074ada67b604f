"""The optax chain of SERA training (docs/design/algorithm.md §6.3): global-norm clip 1.0, then AdamW with decoupled weight decay.

Defaults: lr 3e-6, weight decay 0.017, β = (0.9, 0.95), ε = 1e-8, constant learning rate after a linear warm-up of
``warmup_steps`` (the reference's formula step / warmup, so with one warm-up step the very first update runs at lr 0).
``decay_steps`` (not in the paper; default none) instead decays the rate linearly to 0 over that many updates after
the warm-up, for short fixed-budget runs such as the tiny CPU default.
Optimizer state follows the parameters' dtype: with fp32 master weights, both Adam moments are fp32.
"""

from __future__ import annotations

import dataclasses

import optax


@dataclasses.dataclass(frozen=True)
class OptimConfig:
    lr: float = 3e-6
    weight_decay: float = 0.017
    b1: float = 0.9
    b2: float = 0.95
    eps: float = 1e-8
    clip_norm: float = 1.0
    warmup_steps: int = 1
    decay_steps: int | None = None   # None: constant after warm-up (spec); N: linear decay to 0 over N updates

    def __post_init__(self) -> None:
        if self.lr <= 0 or self.clip_norm <= 0 or self.eps <= 0:
            raise ValueError("optim.lr, optim.clip_norm and optim.eps must be positive")
        if not (0 <= self.b1 < 1 and 0 <= self.b2 < 1):
            raise ValueError(f"optim.b1 / optim.b2 must lie in [0, 1), got {self.b1}, {self.b2}")
        if self.warmup_steps < 0 or self.weight_decay < 0:
            raise ValueError("optim.warmup_steps and optim.weight_decay must be ≥ 0")
        if self.decay_steps is not None and self.decay_steps < 1:
            raise ValueError(f"optim.decay_steps must be ≥ 1 (or null), got {self.decay_steps}")


def learning_rate(cfg: OptimConfig) -> optax.Schedule:
    """Returns the schedule: lr · step / warmup for step < warmup, then lr (or, with ``decay_steps`` = N,
    lr · (1 − (step − warmup) / N), reaching 0 at step warmup + N)."""
    after = (optax.constant_schedule(cfg.lr) if cfg.decay_steps is None
             else optax.linear_schedule(cfg.lr, 0.0, cfg.decay_steps))
    if cfg.warmup_steps == 0:
        return after
    return optax.join_schedules([optax.linear_schedule(0.0, cfg.lr, cfg.warmup_steps), after], [cfg.warmup_steps])


def make_optimizer(cfg: OptimConfig) -> optax.GradientTransformation:
    """Returns clip_by_global_norm(clip_norm) → AdamW(schedule, b1, b2, eps, weight_decay)."""
    return optax.chain(
        optax.clip_by_global_norm(cfg.clip_norm),
        optax.adamw(learning_rate(cfg), b1=cfg.b1, b2=cfg.b2, eps=cfg.eps, weight_decay=cfg.weight_decay),
    )
