"""One task group's rollout for the training loop: ``rollout.trees_per_task`` root trees of one task at a stage and
policy version, on one pinned engine, then the labels the stage needs (docs/design/recipes.md §1b, §3)."""

from __future__ import annotations

import dataclasses
from typing import Any

from sera_jax.agents.launchers.factory import make_launcher_factory, usable_trees
from sera_jax.agents.records import Tree
from sera_jax.agents.runtime import run_trees
from sera_jax.agents.settings import RuntimeSettings
from sera_jax.agents.subagent_judge import DeferredJudge, SubagentJudge
from sera_jax.assembly.settings import stage_settings
from sera_jax.config import RunConfig
from sera_jax.rl.stages import MethodConfig


@dataclasses.dataclass
class GroupRunner:
    """Runs task groups (``Loop.run_group``): the run's engines, tokenizer, settings, judge and labellers.

    ``branch_labels`` (TextWorld's rubric stage) labels the RT branches of fork groups after the trees, so the
    rubric-generation launchers get a deferred judge; ``execution_labels`` (the RAO family's TextWorld sub-agent
    rewards) labels the execution stage's sub-agents; ``pool`` is TextCraft's env-worker pool (None elsewhere)."""

    cfg: RunConfig
    method: MethodConfig
    engine: Any                                   # EngineReplicas: ``pinned()`` keeps a group on one engine
    tokenizer: Any
    settings: RuntimeSettings                     # the run's (assembly.settings.runtime_settings)
    judge: Any = None
    branch_labels: SubagentJudge | None = None
    execution_labels: SubagentJudge | None = None
    pool: Any = None
    roles: Any = None                             # agents.roles.RoleCallers: who writes, scores (None: the policy)

    async def __call__(self, task: Any, stage: str, version: int) -> list[Tree]:
        """Returns the usable, labelled trees of ``task``'s group at ``stage`` under policy ``version``."""
        cfg, env = self.cfg, self.cfg.env.name
        deferred = stage == "rubric_generation" and self.branch_labels is not None
        factory = make_launcher_factory(stage, self.method, env, judge=DeferredJudge() if deferred else self.judge,
                                        settings=self.settings, roles=self.roles)
        with self.engine.pinned():  # the group's trees, forks and scoring calls share one engine's prefix cache
            trees = await run_trees([task], env, self.engine, self.tokenizer,
                                    stage_settings(self.settings, cfg, stage, version),
                                    rollouts_per_task=cfg.rollout.trees_per_task, pool=self.pool,
                                    max_concurrent=cfg.rollout.trees_per_task, launcher_factory=factory,
                                    textworld_rules=cfg.env.rules)
            trees = await factory.finalize(trees)
        trees = usable_trees(trees)
        if deferred:
            await self.branch_labels.label_fork_groups(trees)
        elif stage == "execution" and self.execution_labels is not None:
            await self.execution_labels.label_subagents(trees)
        return trees
