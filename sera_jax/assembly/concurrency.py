"""How many task groups a run has in flight (docs/design/recipes.md §2's quota arithmetic): sizes the engines and bounds
``training.admission``'s ranks."""

from __future__ import annotations

from sera_jax.config import RunConfig


def per_rank_concurrency(max_concurrent_rollouts: int, ranks: int = 8) -> int:
    """Returns C = max(1, ⌊max_concurrent_rollouts / ranks⌋): the reference splits the cap over its 8 ranks."""
    return max(1, max_concurrent_rollouts // ranks)


def max_groups_in_flight(ranks: int, concurrency: int, max_offpolicyness: int, speculative: int = 0) -> int:
    """Returns the most task groups that can run at once: per rank min(C, ofp + 1) under the quota, plus the
    speculative ones (sizes the sampling engine's rows)."""
    return ranks * (min(concurrency, max_offpolicyness + 1) + speculative)


def groups_in_flight(cfg: RunConfig) -> int:
    """Returns the most task groups the run's admission can have running at once (sizes the engines)."""
    r, method = cfg.rollout, cfg.method_config()
    ranks = max(r.tasks_per_step, r.rubric_stage_tasks_per_step or 0)
    return max_groups_in_flight(ranks, per_rank_concurrency(cfg.max_concurrent_rollouts(), r.tasks_per_step),
                                method.max_head_offpolicyness, r.speculative_groups_per_rank)
