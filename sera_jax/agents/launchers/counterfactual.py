"""The counterfactual collector of the rubric-generation stage (docs/design/algorithm.md §4, §3.6 second half, §12.2, §12.6).

Per root rollout an environment budget: ``created`` starts at 1 (the root's world), the maximum is 16. At each
delegation, if ``created`` ≥ 16 the child runs as under the default launcher; otherwise a whole group of 8 is
reserved (``created += 8``, even past the cap: a soft cap), so the 1st delegation makes created 9, the 2nd 17, and
later ones are plain children. Reservation happens without an ``await`` between check and increment, so it is in
call order even among concurrent launches, and a second group may sit inside a branch of the first.

A fork group: the observable state S0 is read, the world is forked 8 times, and branch b runs the delegated child
``<child id>#b<b>`` to completion on its own isolated copy (all 8 concurrently, so their first prompts share cached prefix blocks in
the engine: identical in TextCraft; in TextWorld up to the agent id in the system prompt). Branches are labelled by the judge (TextCraft: the programmatic check;
TextWorld: a judge, see ``judge.py``). Branch 0 is committed — always branch 0, not the best — and the other worlds
are dropped. The parent is told ``{msg}\\n\\nSelected branch: 0; counterfactual branches collected: {n}.\\n``
(msg = branch 0's finish message, else its error, else ``Subagent branch 0 completed.``); a TextWorld parent also
gets its fresh observation after it. The tree records a ``ForkGroup`` with one ``Branch`` per branch (trajectory
id, depth, reward, label, initial/final state, messages, selected) and the branch nodes carry
``fork_group_id`` / ``branch_index``.

After the tree has finished, ``finalize(tree)`` writes, per *complete* group, a fresh rubric (policy call at
temperature 1.0, 1,024 tokens, from the parent's stored pre-delegation messages, its whole raw delegating reply,
branch 0's initial state, the TextCraft tool list whatever the environment, the budget the delegation asked for and
the fork-group metadata; recorded as ``ForkGroup.rubric_turn``, which ``rl.datums.rubric_datums`` trains) and 8
scoring calls at temperature 0 (``score_turns``, never trained; ``Branch.score``). An invalid rubric skips the
group; an invalid score leaves that branch's score None (it is left out of the ranking).

The parent reply shown is the launch request's ``parent_action``, kept in the tree record at the launch: the same
text the execution stage's rubric writer sees (TextCraft thought + code, ``</python>`` appended when missing;
TextWorld the whole reply). Departure: the reference decodes the parent's completion tokens with special tokens kept
here, so its text can also end in a special token (e.g. ``<|im_end|>`` where a TextCraft reply stopped without
``</python>``); we show the reply text without special tokens in both stages.

Depth: the runtime refuses a launch beyond the depth limit before any launcher runs, with the default launcher's
refusal text (the reference's collector words it differently); no group is reserved for a refused launch.

Concurrent launches from one TextCraft cell (``asyncio.gather``, docs/design/algorithm.md §14): in deterministic mode the runtime
serialises launches of one parent (``TreeRun.sibling_order``), so they are handled one after another. Otherwise
they overlap as in the reference: each takes its own reservation in call order (so a sibling may get a group while a
later one falls back to a plain shared-world child), every group forks the world as it is when it starts, and a
group's branch-0 commit replaces the *whole* shared world (inventory cleared and refilled, agent records replaced)
— it can erase a concurrent sibling's changes. That overwrite is kept on purpose (it is the reference's
behaviour); ``tests/agents/launchers/test_counterfactual.py`` shows it.
"""

from __future__ import annotations

import asyncio
import dataclasses
from typing import Any

from sera_jax.agents.env_name import EnvName
from sera_jax.agents.environments import environment
from sera_jax.agents.launchers.base import (
    ChildSpec,
    DefaultLauncher,
    LaunchOutcome,
    LaunchRequest,
    child_result,
)
from sera_jax.agents.policy_call import CallSpec
from sera_jax.agents.records import Branch, ForkGroup, Node, Tree
from sera_jax.agents.roles import POLICY_ROLES, RoleCallers
from sera_jax.agents.rubric_calls import (
    RubricConfig,
    observable_state,
    rubric_context,
    score_node,
    write_rubric,
)

BRANCHES = 8
MAX_ENVS = 16
INPUTS_KEY = "fork_group_inputs"


def collector_text(branch0: Node | None, collected: int) -> str:
    """Returns what the parent is told after a fork group (docs/design/algorithm.md §1.5, counterfactual collector)."""
    msg = (branch0.finish_message or branch0.error_message) if branch0 is not None else None
    msg = msg or "Subagent branch 0 completed."
    return f"{msg}\n\nSelected branch: 0; counterfactual branches collected: {collected}.\n"


class CounterfactualCollector:
    """Fork-8 branching at delegations while the tree's env budget lasts (see the module docstring)."""

    kind = "counterfactual"

    def __init__(self, env: EnvName, judge: Any, config: RubricConfig | None = None, *, branches: int = BRANCHES,
                 max_envs: int = MAX_ENVS, roles: RoleCallers | None = None):
        self.env, self.judge, self.config = env, judge, config or RubricConfig()
        # Who scores the branches (agents/roles.py); the rubric is the trainable policy's, its tokens the datum
        # (config/validate.py refuses another writer for this stage).
        self.roles = roles or POLICY_ROLES
        self.branches, self.max_envs = branches, max_envs
        self.created = 1
        self.run: Any = None
        self._default = DefaultLauncher()

    def reserve(self) -> bool:
        """Returns True and books a whole group when fewer than ``max_envs`` environments exist (soft cap)."""
        if self.created >= self.max_envs:
            return False
        self.created += self.branches
        return True

    async def launch(self, req: LaunchRequest) -> LaunchOutcome:
        """Returns branch 0's child per spec (texts = the collector's message) or, with the budget spent, the
        default launcher's outcome."""
        self.run = req.run
        if not self.reserve():
            return await self._default.launch(req)
        children, texts, groups, ids = [], [], [], []
        for k, spec in enumerate(req.specs):
            if k > 0 and not self.reserve():  # later goals of one TextWorld delegate block: budget permitting
                child = await req.start_child(spec)
                children.append(child)
                ids.append(child.id)
                texts.append(child_result(child))
                continue
            req.run.tree.counterfactual_environment_count = self.created
            group, nodes = await self._group(req, spec)
            groups.append(group.id)
            ids.extend(b.trajectory_id for b in group.branches if b.trajectory_id)
            children.append(nodes[0])
            texts.append(collector_text(nodes[0], sum(1 for b in group.branches if b.trajectory_id)))
        if environment(self.env).observation_after_launch:
            obs, _ = await req.env.observe(req.parent.id)
            texts[-1] += f"\n[Current Environment Observation]\n{obs}"
        self._annotate(req, ids, groups)
        return LaunchOutcome(children=children, kind=self.kind, texts=texts, misc={"fork_groups": groups})

    async def _group(self, req: LaunchRequest, spec: ChildSpec) -> tuple[ForkGroup, list[Node | None]]:
        tree: Tree = req.run.tree
        gid = f"{tree.id}:fg{len(tree.fork_groups)}:{spec.child_id}"
        group = ForkGroup(id=gid, parent_id=req.parent.id, fork_step=req.fork_step, child_depth=spec.depth,
                          goal=spec.goal, num_branches=self.branches)
        tree.fork_groups.append(group)  # registered now so nested groups number after it
        # What the post-hoc rubric needs beyond the nodes, kept in the record so a group can be ranked (again) from
        # the JSONL alone: the parent's messages before the delegating reply, that whole reply, the child's budget.
        tree.misc.setdefault(INPUTS_KEY, {})[gid] = {"messages": [dict(m) for m in req.parent_messages],
                                                      "action": req.parent_action, "budget": spec.budget_shown()}
        snapshot = await observable_state(req.env)
        worlds = [await req.env.fork() for _ in range(self.branches)]

        async def branch(b: int) -> tuple[Node | None, str]:
            try:
                node = await req.start_child(dataclasses.replace(spec, child_id=f"{spec.child_id}#b{b}"),
                                             env=worlds[b])
                return node, ""
            except Exception as e:  # noqa: BLE001  (a branch that cannot even start: success false, recorded)
                return None, f"{type(e).__name__}: {e}"

        results = await asyncio.gather(*(branch(b) for b in range(self.branches)))
        for b, (node, err) in enumerate(results):
            label = await self._label(node, req.parent.goal) if node is not None else None
            if node is not None:
                node.fork_group_id, node.branch_index = gid, b
            group.branches.append(Branch(
                branch_index=b, trajectory_id=node.id if node else None, depth=spec.depth,
                reward=(0.0 if node.rollout_error_zero_reward else node.reward.environment) if node else 0.0,
                success=label if node else False,
                initial_state=snapshot, final_state=await observable_state(worlds[b]),
                finish_message=node.finish_message if node else None,
                error_message=(node.error_message if node else err), selected=b == 0))
        if results[0][0] is not None and group.branches[0].final_state:
            await req.env.commit(worlds[0])
        for w in worlds:
            try:
                await w.close()
            except Exception:  # noqa: BLE001  (a dropped branch that fails to free is no reason to fail the parent)
                pass
        return group, [n for n, _ in results]

    async def _label(self, node: Node, parent_goal: str) -> bool | None:
        try:
            label = await self.judge.label(node, parent_goal)
        except Exception as e:  # noqa: BLE001  (judge failure → branch excluded, docs/design/algorithm.md §4)
            node.misc["label_error"] = f"{type(e).__name__}: {e}"
            return None
        # What the label cost is kept with it, so step metrics can sum the supervision spent from the records.
        node.misc["judge_label"] = {"success": label.success, "reason": label.reason, "error": label.error,
                                    "calls": label.attempts, "prompt_tokens": label.prompt_tokens,
                                    "completion_tokens": label.completion_tokens, "unmetered_calls": label.unmetered,
                                    **({"backend": b} if (b := getattr(self.judge, "backend", None)) else {})}
        return label.success

    def _annotate(self, req: LaunchRequest, ids: list[str], groups: list[str]) -> None:
        # The runtime recorded the delegation with the requested ids; point it at the branches and the group.
        for dp in reversed(req.run.tree.delegations):
            if dp.parent_id == req.parent.id and dp.fork_step == req.fork_step and \
                    set(dp.child_ids) >= {s.child_id for s in req.specs}:
                dp.fork_group_id = groups[0] if groups else None
                dp.child_ids = ids
                break

    # -- after the tree ---------------------------------------------------------------------------------------
    async def finalize(self, tree: Tree) -> dict:
        """Ranks the tree's complete fork groups (``rank_fork_groups``) with this tree's generator and key."""
        if self.run is None:  # no delegation happened: nothing to rank
            tree.misc["rubric_stats"] = {"groups": 0, "complete": 0, "rubric_invalid": 0, "scores": 0,
                                         "score_invalid": 0}
            return dict(tree.misc["rubric_stats"])
        return await rank_fork_groups(tree, self.run, self.config, roles=self.roles)


async def rank_fork_groups(tree: Tree, run: Any, config: RubricConfig, *, roles: RoleCallers | None = None) -> dict:
    """Writes the fresh rubric and the 8 branch scores of every complete fork group of ``tree``; returns counts
    (also in ``tree.misc["rubric_stats"]``).

    ``run`` supplies the calls: a ``TreeRun``, or for a tree read back from JSONL any object with ``tree``,
    ``generator``, ``tokenizer``, ``root_key`` and ``settings`` (e.g. a ``types.SimpleNamespace``)."""
    stats = {"groups": len(tree.fork_groups), "complete": 0, "rubric_invalid": 0, "scores": 0, "score_invalid": 0}
    notes = tree.misc.setdefault("fork_group_notes", {})
    inputs = tree.misc.get(INPUTS_KEY, {})
    groups = [g for g in tree.fork_groups if g.complete and g.id in inputs]
    stats["complete"] = len(groups)
    roles = roles or POLICY_ROLES
    results = await asyncio.gather(*(_rank_group(run, config, tree, g, inputs[g.id], roles) for g in groups))
    for g, note in zip(groups, results):
        notes[g.id] = note
        stats["rubric_invalid"] += int(g.rubric is None)
        stats["scores"] += sum(1 for b in g.branches if b.score is not None)
        stats["score_invalid"] += sum(1 for b in g.branches if b.score is None) if g.rubric is not None else 0
    tree.misc["rubric_stats"] = stats
    return stats


async def _rank_group(run: Any, cfg: RubricConfig, tree: Tree, g: ForkGroup, inputs: dict,
                      roles: RoleCallers) -> dict:
    parent = tree.nodes[g.parent_id]
    # The launch-time reply, as the execution stage shows it (module docstring: the special-token departure).
    ctx = rubric_context(parent, inputs["messages"], inputs["action"], g.branches[0].initial_state or {}, g.goal,
                         env=run.settings.env, stage="rubric_generation", child_budget=int(inputs["budget"]),
                         metadata={"fork_group_id": g.id, "parent_trajectory_id": parent.id,
                                   "parent_depth": parent.depth, "child_depth": g.child_depth,
                                   "fork_step": g.fork_step, "branch_index": 0})
    call, rubric, err = await write_rubric(run, ctx, cfg.rubric_spec(), f"rubric:{g.id}", min_items=cfg.min_items,
                                           depth=parent.depth, caller=roles.rubric_writer)
    g.rubric_turn, g.rubric, g.score_turns = call.turn, rubric, []
    for b in g.branches:
        b.score = None
    if rubric is None:
        g.skipped = True
        return {"rubric_error": err}
    spec: CallSpec = cfg.scoring_spec()
    scored = await asyncio.gather(*(score_node(run, rubric, tree.nodes[b.trajectory_id], b.final_state or {},
                                               spec, f"score:{g.id}#b{b.branch_index}", caller=roles.scorer)
                                    for b in g.branches))
    errors = {}
    for b, (scall, score, serr) in zip(g.branches, scored):
        if scall.turn is not None:
            scall.turn.index = b.branch_index
            g.score_turns.append(scall.turn)
        b.score = score.value if score is not None else None
        if serr:
            errors[str(b.branch_index)] = serr
    return {"score_errors": errors}
