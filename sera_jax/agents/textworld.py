"""The TextWorld-Sync agent: one action / inventory / delegate / finish block per turn (docs/design/textworld.md §10–11).

Per turn: observe (stop if the shared world is solved, failed or done), generate, parse with the env's protocol,
then act: a world step for an action (or an invalid reply's fallback command, which also costs a world step), a
free inventory look-up, the finish message, or a delegation. A delegate block at the depth limit costs a turn and
gets the rejection text; otherwise its children (``<parent>/subagent-<step>-<k>``, each with budget
min(requested, max_steps)) run through the tree's launcher on the same world, and the parent's observation is the
``[SubAgent Results]`` summary followed by its fresh observation. The user message after each turn carries that
observation, the agent's budget, the valid actions and the score flags.

Departure from the reference (on purpose): the first user message keeps the *initial* observation; the reference
refreshes it every turn, which would re-template the prompt each turn and defeat prefix caching and prefix merging.
The current observation is in every per-turn message anyway. ``prompt_style: compact`` (the tiny CPU default) uses
``textworld_prompt``'s compact texts: the same observation and valid actions, without the paper's instructions.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from envs_py.textworld_sync import messages as M
from envs_py.textworld_sync.protocol import parse_reply
from sera_jax.agents.envs import LocalTextWorldEnv, PoolTextWorldEnv
from sera_jax.agents.harness import Episode, TreeRun, run_episode
from sera_jax.agents.launchers.base import ChildSpec, LaunchRequest
from sera_jax.agents.records import DelegationPoint, Node, Turn
from sera_jax.agents.textworld_prompt import (
    compact_feedback,
    compact_system_prompt,
    compact_task_message,
    system_prompt,
)

CRASH_PREFIX = "SubAgent crashed: "


def _over(infos: dict) -> bool:
    return bool(infos.get("tasksuccess") or float(infos.get("score", 0.0) or 0.0) >= 1.0 or infos.get("done")
                or infos.get("taskfailure"))


class TextWorldEpisode(Episode):
    """One TextWorld-Sync agent on the shared world ``env`` (PoolTextWorldEnv / LocalTextWorldEnv or a branch)."""

    def __init__(self, run: TreeRun, node: Node, env, task_text: str):
        super().__init__(run, node)
        self.env, self.task_text = env, task_text
        self.obs, self.infos = "", {}
        self._reply_text = ""

    async def start(self) -> None:
        s, node = self.run.settings, self.node
        obs, infos = await self.env.observe(node.id)
        self.node.misc["initial_observation"] = obs
        can_delegate = s.subagents_enabled and node.depth < s.max_depth
        if s.prompt_style == "compact":
            self.messages = [
                {"role": "system", "content": compact_system_prompt(can_delegate)},
                {"role": "user", "content": compact_task_message(self.task_text, obs,
                                                                 list(infos.get("validActions") or []))},
            ]
            return
        self.messages = [
            {"role": "system", "content": system_prompt(node.id, node.depth, s.max_depth, can_delegate,
                                                        s.subagents_enabled)},
            {"role": "user", "content": M.task_message_text(self.task_text, node.max_steps, obs,
                                                            list(infos.get("validActions") or []),
                                                            s.subagents_enabled)},
        ]

    async def before_turn(self) -> bool:
        self.obs, self.infos = await self.env.observe(self.node.id)
        return _over(self.infos)

    async def act(self, turn: Turn, text: str) -> None:
        node = self.node
        reply = parse_reply(text)
        turn.code = text  # the whole reply: credit assignment finds the delegate block in it
        turn.misc["reply_kind"] = reply.kind
        self._reply_text = text
        observation = ""
        if reply.kind == "finish":
            node.finish_message = reply.message
            turn.output = reply.message
            self.done = True
            self.messages.append({"role": "assistant", "content": text})
            return
        if reply.kind == "inventory":
            observation = M.inventory_lookup_text(await self.env.inventory_text(), self.obs)
        elif reply.kind == "action":
            r = await self._step(turn, reply.command)
            observation, turn.error = r.observation, r.error
        elif reply.kind == "delegate":
            observation = await self._delegate(turn, reply)
        else:  # invalid: the error is shown; a fallback command (if any) still costs a world step (textworld.md §10.1)
            turn.error = reply.error
            turn.misc["fallback"] = reply.fallback
            if reply.fallback and reply.fallback_is_inventory:
                inner = M.inventory_lookup_text(await self.env.inventory_text(), self.obs)
            elif reply.fallback:
                inner = (await self._step(turn, reply.fallback)).observation
            else:
                inner = self.obs
            observation = M.invalid_reply_text(reply.error, inner)
        turn.output = observation
        self.obs, self.infos = await self.env.observe(node.id)
        if _over(self.infos):
            self.done = True
        self.messages.append({"role": "assistant", "content": text})
        if self.run.settings.prompt_style == "compact":
            feedback = compact_feedback(observation, list(self.infos.get("validActions") or []))
        else:
            feedback = M.turn_feedback_text(turn.index, observation, node.max_steps, self.infos)
        self.messages.append({"role": "user", "content": feedback})

    async def _step(self, turn: Turn, command: str):
        self.run.event("env_start", node=self.node.id, turn=turn.index)
        try:
            return await self.env.step(self.node.id, command)
        finally:
            self.run.event("env_end", node=self.node.id, turn=turn.index)

    async def _delegate(self, turn: Turn, reply) -> str:
        node, run, s = self.node, self.run, self.run.settings
        goals = [d.goal for d in reply.delegations]
        if not s.subagents_enabled or node.depth >= s.max_depth:
            text = M.depth_rejection_text(node.depth, self.obs, s.max_depth)
            run.record_delegation(DelegationPoint(node.id, turn.index, [], goals, "", "refused", text))
            return text
        specs = [ChildSpec(M.child_agent_id(node.id, turn.index, k), d.goal, node.depth + 1,
                           min(int(d.max_steps), s.max_steps), requested_steps=int(d.max_steps))
                 for k, d in enumerate(reply.delegations)]
        dp = run.record_delegation(DelegationPoint(node.id, turn.index, [c.child_id for c in specs], goals))
        # The whole raw reply (free text and the delegate block) is the parent action every rubric writer sees.
        request = LaunchRequest(run=run, parent=node, fork_step=turn.index, specs=specs,
                                parent_messages=[dict(m) for m in self.messages], parent_action=self._reply_text,
                                env=self.env, start_child=self._start_child)
        outcome = await run.launcher.launch(request)
        dp.kind = outcome.kind
        dp.misc.update(outcome.misc)
        obs, _ = await self.env.observe(node.id)
        if outcome.texts is not None:
            text = "\n".join(outcome.texts)
        else:
            text = M.subagent_results_text([child_summary(c) for c in outcome.children], obs)
        dp.result = text
        return text

    async def _start_child(self, spec: ChildSpec, env=None, gate=None) -> Node:
        """Adds ``spec`` as an agent of ``env`` (default: the shared world), runs it (in ``gate``'s lockstep group
        when given); returns its Node."""
        env = env if env is not None else self.env
        await env.add_agent(spec.child_id)
        child = self.run.new_node(spec.child_id, spec.goal, depth=spec.depth, parent_id=self.node.id,
                                  fork_step=len(self.node.turns), max_steps=spec.max_steps)
        episode = TextWorldEpisode(self.run, child, env, spec.goal)
        episode.gate = gate
        return await run_episode(episode)

    async def finish(self) -> None:
        node = self.node
        check = await self.env.check()
        obs, infos = await self.env.observe(node.id)
        success = 1.0 if check.success else 0.0
        node.env_labels.update({"success": success, "reason": check.reason})
        node.reward = dataclasses.replace(node.reward, environment=success)
        node.misc.update({
            "returned_to_parent": node.depth > 0 and node.finish_message is not None,
            "environment_success": bool(check.success), "environment_done": bool(infos.get("done")),
            "steps": len(node.turns), "remaining_steps": max(node.max_steps - len(node.turns), 0),
            "final_score": float(infos.get("score", 0.0) or 0.0),
            "final_tasksuccess": bool(infos.get("tasksuccess")), "final_taskfailure": bool(infos.get("taskfailure")),
            "final_observation": obs,
        })


def child_summary(child: Node) -> dict:
    """Returns the record of a returned child that the ``[SubAgent Results]`` block needs."""
    message = child.finish_message
    if child.rollout_error_zero_reward and message is None:
        message = CRASH_PREFIX + (child.error_message or "").split("\n", 1)[0]
    return {"agent_id": child.id, "returned_to_parent": child.misc.get("returned_to_parent", False),
            "environment_success": child.misc.get("environment_success", False), "steps": len(child.turns),
            "max_steps": child.max_steps, "remaining_steps": max(child.max_steps - len(child.turns), 0),
            "finish_message": message, "final_observation": child.misc.get("final_observation", "")}


async def open_world(task: Any, *, tree_id: str, pool: Any, settings: Any, rules: str = "reference") -> Any:
    """Returns the handle on a fresh world for ``task`` under ``rules``: in ``pool`` when given (world steps off the
    event loop), else in-process."""
    if pool is not None:
        return await PoolTextWorldEnv.create(pool, tree_id, task, rules=rules)
    return await LocalTextWorldEnv.create(task, rules=rules)


def root_episode(run: TreeRun, world: Any, task: Any, root_id: str) -> "TextWorldEpisode":
    """Returns the root agent's episode (its node registered in ``run``)."""
    root = run.new_node(root_id, task.goal, depth=0, parent_id=None, fork_step=None,
                        max_steps=run.settings.max_steps)
    return TextWorldEpisode(run, root, world, task.goal)
