"""The stage kernel (docs/design/algorithm.md §7) and the method switches (docs/design/algorithm.md §8).

The routing clock is the policy version v (completed optimizer updates; a skipped step does not advance it), so a
schedule like "execution:16,delegation:2,rubric_generation:2" maps v to (cycle, offset) = divmod(v, 20) and the
offset to a stage. Each method of the paper is one frozen ``MethodConfig``; ``METHODS`` holds all seven.
"""

from __future__ import annotations

import dataclasses
from functools import lru_cache

__all__ = [
    "DEFAULT_SCHEDULE", "STAGES", "parse_schedule", "StagePosition", "position", "stage_for_version",
    "MethodConfig", "METHODS", "method_config",
]

DEFAULT_SCHEDULE = "execution:16,delegation:2,rubric_generation:2"
STAGES = ("execution", "delegation", "rubric_generation")


@lru_cache(maxsize=64)
def parse_schedule(schedule: str) -> tuple[tuple[str, int], ...]:
    """Returns the schedule as ((stage, length), ...); raises ValueError on unknown stages or lengths < 1."""
    out = []
    for part in schedule.split(","):
        name, sep, count = part.strip().partition(":")
        name = name.strip()
        if not sep or name not in STAGES:
            raise ValueError(f"bad schedule entry {part!r} in {schedule!r}")
        n = int(count)
        if n < 1:
            raise ValueError(f"stage length must be ≥ 1 in {schedule!r}")
        out.append((name, n))
    if not out:
        raise ValueError("empty schedule")
    return tuple(out)


@dataclasses.dataclass(frozen=True)
class StagePosition:
    cycle: int
    offset: int
    stage: str


def position(version: int, schedule: str = DEFAULT_SCHEDULE) -> StagePosition:
    """Returns (cycle, offset within the cycle, stage name) for policy version ``version`` ≥ 0."""
    if version < 0:
        raise ValueError("policy version must be ≥ 0")
    parts = parse_schedule(schedule)
    cycle, offset = divmod(int(version), sum(n for _, n in parts))
    rest = offset
    for name, n in parts:
        if rest < n:
            return StagePosition(cycle, offset, name)
        rest -= n
    raise AssertionError("unreachable: offset < cycle length")


def stage_for_version(version: int, schedule: str = DEFAULT_SCHEDULE) -> str:
    """Returns the stage ("execution", "delegation" or "rubric_generation") that policy version ``version`` trains."""
    return position(version, schedule).stage


@dataclasses.dataclass(frozen=True)
class MethodConfig:
    """Every switch that differs between the paper's methods, plus the shared values of docs/design/algorithm.md §8."""

    name: str
    execution_reward: str                     # "rao" (env success for sub-agents) | "rubric" (policy rubric score)
    stage_schedule: str
    ranking_objective: str = "hinge"          # "hinge" | "order_discrimination" (Rank+Disc)
    order_weight: float = 0.5
    disc_weight: float = 0.5
    discrimination_scale: float = 2.0
    ranking_margin: float = 0.2
    branching_factor: int = 8
    max_counterfactual_envs_per_rollout: int = 16
    # Not in the paper: reject a rubric-generation task group with no ranked fork group (none forked, or every
    # group's branches agreed) instead of accepting it (§5.6), so the step keeps sampling rather than being skipped.
    rubric_filter_unranked_groups: bool = False
    # Not in the paper: the rubric reward's leave-one-out baseline over the ranked fork groups of one task ("task",
    # §5.2) or of the whole step's accepted task groups ("step"). With few delegation points per task (the tiny
    # default forks one per tree), a task nearly always has K = 1 ranked group, whose advantage is 0 by §5.2.
    rubric_baseline_scope: str = "task"
    # Not in the paper: a control that multiplies the rubric-generation stage's advantages by -1 (or 1: as is).
    rubric_advantage_sign: float = 1.0
    # leaf_credit.*
    delegation_filter_zero_variance_groups: bool = True
    invalid_delegation_reward: float = 0.0
    launch_advantage_mode: str = "reward_first_root_balanced"
    launch_credit_mode: str = "leaf"
    subagent_success_gate: bool = False
    workload_weight_cap: float = 1.0
    # rubric_subagent_reward.*
    rubric_provider: str = "policy"
    rubric_temperature: float = 1.0
    scoring_temperature: float = 0.0
    max_rubric_tokens: int = 1024
    max_scoring_tokens: int = 1024
    rubric_stage_max_scoring_tokens: int = 1024   # the RT stage's scoring cap (TextWorld recipes: 512)
    min_rubric_criteria: int = 2
    failure_policy: str = "drop_trajectory"
    # global
    group_size: int = 8
    leave_one_out_baseline: bool = True
    depth_level_weighting: bool = True
    depth_level_discount_gamma: float | None = None
    cispo_ratio_min: float = 0.0
    cispo_ratio_max: float = 5.0
    max_head_offpolicyness: int = 0
    seed: int = 353
    concurrent_rollouts: int = 24

    def __post_init__(self) -> None:
        if self.execution_reward not in ("rao", "rubric"):
            raise ValueError(f"execution_reward must be 'rao' or 'rubric', got {self.execution_reward!r}")
        if self.ranking_objective not in ("hinge", "order_discrimination"):
            raise ValueError(f"unknown ranking objective {self.ranking_objective!r}")
        if abs(self.order_weight + self.disc_weight - 1.0) > 1e-9 or self.discrimination_scale < 0:
            raise ValueError("order/disc weights must sum to 1 and the scale must be ≥ 0")
        if self.scoring_temperature != 0.0:
            raise ValueError("scoring temperature must be 0 (the launcher refuses anything else)")
        # The paper forks 8 branches (every METHODS entry does); fewer is a configured saving (the tiny CPU default
        # forks 4), but a ranking needs at least two branches.
        if self.uses("rubric_generation") and self.branching_factor < 2:
            raise ValueError(f"rubric-generation ranking needs branching_factor ≥ 2, got {self.branching_factor}")
        if self.rubric_baseline_scope not in ("task", "step"):
            raise ValueError(f"rubric_baseline_scope must be 'task' or 'step', got {self.rubric_baseline_scope!r}")
        if self.rubric_advantage_sign not in (1.0, -1.0):
            raise ValueError(f"rubric_advantage_sign must be 1 or -1, got {self.rubric_advantage_sign}")
        if self.max_counterfactual_envs_per_rollout < 1:
            raise ValueError("max_counterfactual_envs_per_rollout must be ≥ 1")
        if len(parse_schedule(self.stage_schedule)) > 1 and self.max_head_offpolicyness != 0:
            raise ValueError(f"a multi-stage schedule ({self.stage_schedule}) needs max_head_offpolicyness = 0 "
                             f"(got {self.max_head_offpolicyness}): a group's stage is the version that starts it "
                             "(the reference's launcher refuses it too)")

    def uses(self, stage: str) -> bool:
        """Returns True when the schedule contains ``stage``."""
        return any(name == stage for name, _ in parse_schedule(self.stage_schedule))


METHODS: dict[str, MethodConfig] = {m.name: m for m in (
    MethodConfig("RAO", "rao", "execution:1", max_head_offpolicyness=3, seed=343, concurrent_rollouts=8),
    MethodConfig("RAO+D", "rao", "execution:12,delegation:4", seed=343, concurrent_rollouts=12),
    MethodConfig("RAO+RT", "rao", "execution:16,rubric_generation:2"),
    MethodConfig("SERA w/o D & RT", "rubric", "execution:1", max_head_offpolicyness=3, seed=343,
                 concurrent_rollouts=8),
    MethodConfig("SERA w/o D", "rubric", "execution:16,rubric_generation:2"),
    MethodConfig("SERA", "rubric", DEFAULT_SCHEDULE),
    MethodConfig("Rank+Disc", "rubric", "execution:16,rubric_generation:2",
                 ranking_objective="order_discrimination"),
)}

_ALIASES = {"sera": "SERA", "sera_wo_d": "SERA w/o D", "sera_wo_d_rt": "SERA w/o D & RT", "rao": "RAO",
            "rao_d": "RAO+D", "rao_rt": "RAO+RT", "rank_disc": "Rank+Disc"}


def method_config(name: str) -> MethodConfig:
    """Returns the MethodConfig of a paper label ("SERA w/o D") or its slug ("sera_wo_d")."""
    key = _ALIASES.get(name, name)
    if key not in METHODS:
        raise KeyError(f"unknown method {name!r}; known: {sorted(METHODS)} or {sorted(_ALIASES)}")
    return METHODS[key]
