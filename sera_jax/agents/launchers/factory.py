"""Which launcher a tree gets, by stage and method (docs/design/algorithm.md §1.4, §7, §8, §10), and the after-tree step they need.

How train.py uses it for one policy version::

    stage = stage_for_version(v, method.stage_schedule)
    factory = make_launcher_factory(stage, method, env, judge=judge,      # judge: TextWorld rubric stage only
                                    settings=settings)                    # the side calls' caps follow the run's
    trees = await run_trees(tasks, env, engine, tok, settings, rollouts_per_task=8, launcher_factory=factory, ...)
    trees = await factory.finalize(trees)    # awaits background scores / writes fresh rubrics + branch scores
    trees = usable_trees(trees)              # drops rollouts marked by the skip_rollout failure policy
    credit = task_group_credit(stage, trees_of_one_task, method, decode=tok.decode, env=...)

and evaluate.py, for test-time selection: ``make_launcher_factory("evaluation", method, env, selection={"n": 2},
settings=settings)``.

| stage / mode                          | launcher                  |
|---------------------------------------|---------------------------|
| execution, ``execution_reward="rao"``  | DefaultLauncher           |
| execution, ``execution_reward="rubric"`` | RubricCoordinator       |
| delegation                            | DefaultLauncher           |
| rubric_generation                     | CounterfactualCollector   |
| evaluation (selection=None / {...})   | DefaultLauncher / BestOfNSelector |
"""

from __future__ import annotations

from typing import Any, Callable, Sequence

from sera_jax.agents.env_name import EnvName
from sera_jax.agents.environments import environment
from sera_jax.agents.judge import ProgrammaticJudge
from sera_jax.agents.launchers.base import DefaultLauncher
from sera_jax.agents.launchers.best_of_n import BestOfNSelector
from sera_jax.agents.launchers.counterfactual import CounterfactualCollector
from sera_jax.agents.launchers.rubric import RubricCoordinator, usable_trees
from sera_jax.agents.records import Tree
from sera_jax.agents.roles import RoleCallers
from sera_jax.agents.rubric_calls import RubricConfig, run_limits

__all__ = ["LauncherFactory", "make_launcher_factory", "rubric_stage_config", "usable_trees"]


class LauncherFactory:
    """``run_trees``' ``launcher_factory``: one launcher per tree (launchers hold per-tree state such as the env
    budget), remembered by (task id, rollout index) so that ``finalize`` can complete each tree's records."""

    def __init__(self, make: Callable[[], Any], kind: str):
        self._make, self.kind = make, kind
        self.launchers: dict[tuple[str, int], Any] = {}

    def __call__(self, task: Any, rollout_index: int) -> Any:
        launcher = self._make()
        self.launchers[(str(task.task_id), int(rollout_index))] = launcher
        return launcher

    async def finalize(self, trees: Sequence[Tree]) -> list[Tree]:
        """Runs each tree's after-tree step (background scores, fresh rubrics and branch scores) and returns the
        trees; safe to call for launchers that have none."""
        for tree in trees:
            launcher = self.launchers.pop((tree.task_id, int(tree.root_rollout_index or 0)), None)
            if launcher is not None and hasattr(launcher, "finalize"):
                await launcher.finalize(tree)
        return list(trees)


def make_launcher_factory(stage: str, method: Any, env: EnvName, *, judge: Any = None,
                          selection: dict | None = None, settings: Any = None, roles: RoleCallers | None = None,
                          **rubric_overrides: Any) -> LauncherFactory:
    """Returns the LauncherFactory for ``stage`` ("execution" | "delegation" | "rubric_generation" |
    "evaluation") under ``method`` (an ``rl.stages.MethodConfig``). ``judge`` labels TextWorld branches in the
    rubric-generation stage (TextCraft labels are programmatic); ``selection`` (e.g. ``{"n": 2, "fork_budget": 32}``)
    turns on test-time selection in evaluation. ``settings`` (the run's ``RuntimeSettings``) sets the rubric and
    scoring calls' caps: agent prompt cap + agent completion cap − the call's own cap, cut to the serving context
    (without it: TextCraft's training caps and no context cut); ``rubric_overrides`` (RubricConfig fields) win.
    ``roles`` (``agents/roles.py``) says who writes and scores rubrics and who selects; None: the policy."""
    rubric_overrides = {**(run_limits(settings) if settings is not None else {}), **rubric_overrides}
    if stage == "execution":
        if method.execution_reward == "rubric":
            cfg = RubricConfig.from_method(method, **rubric_overrides)
            return LauncherFactory(lambda: RubricCoordinator(env, cfg, roles), "rubric")
        return LauncherFactory(DefaultLauncher, "default")
    if stage == "delegation":
        return LauncherFactory(DefaultLauncher, "default")
    if stage == "rubric_generation":
        if judge is None:
            if not environment(env).programmatic:
                raise ValueError(f"the {env} rubric-generation stage needs a judge (judge.make_judge)")
            judge = ProgrammaticJudge()
        cfg = _rubric_stage(method, rubric_overrides)
        return LauncherFactory(lambda: CounterfactualCollector(
            env, judge, cfg, branches=method.branching_factor,
            max_envs=method.max_counterfactual_envs_per_rollout, roles=roles), "counterfactual")
    if stage == "evaluation":
        if selection:
            opts = dict(selection)
            if rubric_overrides and "config" not in opts:
                opts["config"] = RubricConfig(**rubric_overrides)
            if roles is not None and "roles" not in opts:
                opts["roles"] = roles
            return LauncherFactory(lambda: BestOfNSelector(env, **opts), "best_of_n")
        return LauncherFactory(DefaultLauncher, "default")
    raise ValueError(f"unknown stage {stage!r}")


def _rubric_stage(method: Any, overrides: dict) -> RubricConfig:
    # The post-hoc scoring calls have their own cap (TextWorld's recipes 512, TextCraft's launchers 1,024).
    return RubricConfig.from_method(method, **{"max_scoring_tokens": method.rubric_stage_max_scoring_tokens,
                                               **overrides})


def rubric_stage_config(method: Any, settings: Any = None, **overrides: Any) -> RubricConfig:
    """Returns the RubricConfig of the rubric-generation stage's post-hoc rubric and scoring calls (what
    ``make_launcher_factory("rubric_generation", ...)`` gives its collector), e.g. to rank recorded fork groups
    again."""
    return _rubric_stage(method, {**(run_limits(settings) if settings is not None else {}), **overrides})
