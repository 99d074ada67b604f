"""The execution-stage rubric coordinator (docs/design/algorithm.md §1.4 "rubric coordinator", §3, §3.6–3.7).

At every delegation, for each requested child: the rubric request (temperature 1.0, 1,024 tokens) is started as a
task *before* the child starts, from the parent's pre-delegation conversation, its delegating action, the observable
world state and the child's goal; the child runs exactly as under the default launcher; when the child returns its
scoring (a fresh call at temperature 0 with the frozen rubric, the child's own steps and its final state) is
scheduled in the background. The parent is answered at once with the environment's usual text: it never waits for
or sees the rubric or the score, and the child never sees them either.

A valid score replaces the sub-agent's reward (§3.7): ``node.reward.rubric_score`` ← score, with
``node.reward.environment`` ← the env value at its return (the reference's ``reward/code_success``), and
``node.rubric_score`` ← RubricScore(score, success, original env reward, rubric, payload) records the scoring.
An invalid rubric or score follows ``failure_policy``: ``drop_trajectory`` (default) marks the child
``skip_gradient_update``; ``skip_rollout`` also marks the whole tree (``tree.misc["skip_rollout"]``, and
``usable_trees`` leaves it out); ``fallback_binary`` keeps the env reward as the child's score.

The rubric writer sees (docs/design/recipes.md §3) the parent's messages before the delegating reply, that whole raw reply
(``LaunchRequest.parent_action``: TextCraft thought + code, TextWorld the reply text with its delegate block — the
same text the rubric-generation stage shows), the observable state, the child's goal, the environment's child tools
and the budget the delegation asked for.

Call ``await launcher.finalize(tree)`` once the tree has finished (``LauncherFactory.finalize`` does it): it awaits
the outstanding scoring tasks and returns the counts also written to ``tree.misc["rubric_stats"]``.
"""

from __future__ import annotations

import asyncio
import dataclasses
from typing import Any

from sera_jax.agents.env_name import EnvName
from sera_jax.agents.environments import environment
from sera_jax.agents.launchers.base import LaunchOutcome, LaunchRequest
from sera_jax.agents.lockstep import Lockstep
from sera_jax.agents.policy_call import call_summary
from sera_jax.agents.records import Node, RubricScore, Tree
from sera_jax.agents.roles import POLICY_ROLES, RoleCallers
from sera_jax.agents.rubric import Score
from sera_jax.agents.rubric_calls import (
    RubricConfig,
    final_inventory_state,
    observable_state,
    rubric_context,
    score_node,
    write_rubric,
)


def env_value(node: Node) -> float:
    """Returns the child's environment reward (its binary label; 0 after a rollout error)."""
    if node.rollout_error_zero_reward:
        return 0.0
    return float(node.env_labels.get("success", node.reward.environment or 0.0))


def apply_score(node: Node, score: Score, rubric: dict) -> None:
    """Writes a valid score onto a sub-agent as docs/design/algorithm.md §3.7 says (its reward becomes the score)."""
    original = env_value(node)
    node.rubric_score = RubricScore(score=score.value, success=score.success, original_binary_reward=original,
                                    rubric=rubric, score_payload=score.payload)
    node.reward = dataclasses.replace(node.reward, rubric_score=score.value, environment=original)


def apply_failure(tree: Tree, node: Node, policy: str, reason: str, rubric: dict | None) -> None:
    """Applies a failure policy to a child whose rubric or score is invalid (docs/design/algorithm.md §3.6)."""
    node.misc["rubric_failure"] = reason
    if policy == "fallback_binary":
        original = env_value(node)
        node.rubric_score = RubricScore(score=original, success=original > 0, original_binary_reward=original,
                                        rubric=rubric, score_payload={"fallback_binary": reason})
        node.reward = dataclasses.replace(node.reward, rubric_score=original)
        return
    node.skip_gradient_update = True
    if policy == "skip_rollout":
        tree.misc["skip_rollout"] = reason


def usable_trees(trees: list[Tree]) -> list[Tree]:
    """Returns the trees not dropped by the ``skip_rollout`` failure policy."""
    return [t for t in trees if not t.misc.get("skip_rollout")]


class RubricCoordinator:
    """Rubric before, frozen-rubric score after, for every child (see the module docstring)."""

    kind = "rubric"

    def __init__(self, env: EnvName, config: RubricConfig | None = None, roles: RoleCallers | None = None):
        self.env, self.config = env, config or RubricConfig()
        self.roles = roles or POLICY_ROLES  # who writes and who scores (agents/roles.py)
        self.pending: list[asyncio.Task] = []
        self.stats = {"children": 0, "rubric_invalid": 0, "score_invalid": 0, "scored": 0}

    async def launch(self, req: LaunchRequest) -> LaunchOutcome:
        """Returns the finished children (run as under the default launcher); their scoring continues in the
        background."""
        run, parent, cfg = req.run, req.parent, self.config
        state = await observable_state(req.env)
        rubrics = []
        for spec in req.specs:
            ctx = rubric_context(parent, req.parent_messages, req.parent_action, state, spec.goal, env=self.env,
                                 stage="execution", child_budget=spec.budget_shown(),
                                 metadata={"parent_trajectory_id": parent.id, "parent_depth": parent.depth,
                                           "child_depth": spec.depth, "fork_step": req.fork_step})
            # Started before the child exists: the rubric is written from what the parent knew when delegating.
            rubrics.append(asyncio.ensure_future(write_rubric(run, ctx, cfg.rubric_spec(), f"rubric:{spec.child_id}",
                                                              min_items=cfg.min_items, depth=parent.depth,
                                                              caller=self.roles.rubric_writer)))
        gate = (Lockstep([s.child_id for s in req.specs])
                if run.settings.deterministic and len(req.specs) > 1 else None)

        async def one(spec, rubric_task):
            child = await req.start_child(spec, gate=gate)
            final = (final_inventory_state(child) if environment(self.env).final_state == "child_inventory"
                     else await observable_state(req.env))
            self.pending.append(asyncio.ensure_future(self._score(run, child, rubric_task, final)))
            return child

        children = await asyncio.gather(*(one(s, r) for s, r in zip(req.specs, rubrics)))
        return LaunchOutcome(children=list(children), kind=self.kind)

    async def _score(self, run: Any, child: Node, rubric_task: asyncio.Future, final: dict) -> None:
        try:
            await self._score_inner(run, child, rubric_task, final)
        except Exception as e:  # noqa: BLE001  (a bug here must not lose the tree: the child is treated as unscored)
            self.stats["score_invalid"] += 1
            apply_failure(run.tree, child, self.config.failure_policy, f"scoring error: {type(e).__name__}: {e}",
                          None)

    async def _score_inner(self, run: Any, child: Node, rubric_task: asyncio.Future, final: dict) -> None:
        cfg = self.config
        self.stats["children"] += 1
        call, rubric, err = await rubric_task
        record: dict[str, Any] = {"rubric_call": call_summary(call), "rubric_error": err,
                                  "roles": self.roles.describe()}
        child.misc["rubric"] = record
        if rubric is None:
            self.stats["rubric_invalid"] += 1
            apply_failure(run.tree, child, cfg.failure_policy, f"invalid rubric: {err}", None)
            return
        scall, score, serr = await score_node(run, rubric, child, final, cfg.scoring_spec(), f"score:{child.id}",
                                              caller=self.roles.scorer)
        record.update({"score_call": call_summary(scall), "score_error": serr})
        if score is None:
            self.stats["score_invalid"] += 1
            apply_failure(run.tree, child, cfg.failure_policy, f"invalid score: {serr}", rubric)
            return
        self.stats["scored"] += 1
        apply_score(child, score, rubric)

    async def finalize(self, tree: Tree) -> dict:
        """Awaits every outstanding scoring task of ``tree``; returns (and records in ``tree.misc``) the counts."""
        while self.pending:
            batch, self.pending = self.pending, []
            await asyncio.gather(*batch)
        # Who wrote and scored, named only when not the policy (so the reference's records read as before).
        roles = {k: v for k, v in self.roles.describe().items() if k != "selector" and v != "policy"}
        tree.misc["rubric_stats"] = {**self.stats, **roles}
        return dict(tree.misc["rubric_stats"])
