"""Evaluation: the paper's protocol (trees on a task set) and its report (per-tier and overall rates, mean ± std)."""

from sera_jax.evaluation.report import aggregate

__all__ = ["aggregate"]
