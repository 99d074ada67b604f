"""The TextCraft agent: a CodeAct loop over sandboxed cells, with ``await launch_subagent`` (docs/design/algorithm.md §1.1, §1.4–1.7).

One turn = one LLM call + one code cell run in the agent's own sandbox (env worker process). The cell's
``launch_subagent(targets, context)`` comes back to the runtime as a callback (``_launch``): the world has already
validated it and built the goal string; here the depth limit is enforced again (so ``max_depth`` is a setting),
the child is named ``<parent>/subagent-<fork step>-<k>``, registered in the world (inventory snapshot now) and run by
the tree's launcher; the cell receives the result text of docs/design/algorithm.md §1.5. Several launches from one
cell (``asyncio.gather``) share ``fork_step`` and run concurrently on the shared inventory.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from envs_py.textcraft.cells import (
    clean_output,
    is_stuck,
    observation_text,
    parse_reply,
    subagent_result_text,
)
from sera_jax.agents.envs import TextCraftTreeEnv
from sera_jax.agents.harness import Episode, TreeRun, run_episode
from sera_jax.agents.launchers.base import ChildSpec, LaunchRequest, child_result
from sera_jax.agents.records import DelegationPoint, Node, Turn
from sera_jax.agents.settings import EXHAUSTED_MESSAGE, STUCK_MESSAGE
from sera_jax.agents.textcraft_prompt import (
    assistant_message,
    system_prompt,
    task_message,
)


def task_string(goal: str, max_steps: int) -> str:
    """Returns an agent's task string: its goal and its budget line (docs/design/algorithm.md §1.1)."""
    return f"Your Goal: {goal}\nBudget: You have a total budget of {max_steps} steps to complete this task."


def raw_reply(text: str) -> str:
    """Returns a reply as the rubric writer sees it (the reference's raw action): the whole completion text, the
    ``<thought>`` and ``<python>`` blocks both, with ``</python>`` appended when the stop string did not end it."""
    return text if "</python>" in text else text + "</python>"


def refusal_text(goal: str, depth: int, max_depth: int) -> str:
    """Returns the depth-limit refusal the launching cell receives (docs/design/algorithm.md §1.5)."""
    return (f"Not enough budget to launch subagent for goal {goal}. Launching a subagent from depth {depth} would "
            f"exceed the maximum allowed depth of {max_depth}. The maximum depth for hierarchical delegation has "
            "been reached. You should perform the task yourself instead of delegating.")


class CodeActEpisode(Episode):
    """One TextCraft agent on the tree's world (``env`` is a TextCraftTreeEnv or a branch of it)."""

    exhausted_message = EXHAUSTED_MESSAGE

    def __init__(self, run: TreeRun, node: Node, env):
        super().__init__(run, node)
        self.env = env
        self._reply = ""  # the raw reply whose cell is running (the delegating action, for launchers)

    async def start(self) -> None:
        if self.node.parent_id is None:
            task_text = await self.env.observe(self.node.id)
        else:
            # Built here rather than by the world, whose sub-agent text drops the parent's context (docs/design/algorithm.md §1.1).
            task_text = task_string(self.node.goal, self.node.max_steps)
        style = self.run.settings.prompt_style
        self.messages = [{"role": "system", "content": system_prompt(style)},
                         {"role": "user", "content": task_message(task_text, style)}]

    def stuck(self) -> bool:
        s = self.run.settings
        return is_stuck([t.code for t in self.node.turns], s.loop_threshold, s.loop_max_period)

    async def loop_break(self) -> None:
        # The synthetic finish runs as a real cell (so the world records the message) but has no completion:
        # it produces no datum (docs/design/algorithm.md §1.1).
        code = f"finish({STUCK_MESSAGE!r})"
        turn = Turn(index=len(self.node.turns), prompt_ids=[], completion_ids=[], logprobs=[],
                    policy_version=self.run.settings.policy_version, completion_id=None, code=code,
                    misc={"synthetic": "loop_breaker"})
        self._reply = code  # a synthetic turn has no reply (and its finish cell cannot launch)
        await self._run_cell(turn, code)
        self.node.turns.append(turn)

    async def act(self, turn: Turn, text: str) -> None:
        thought, code = parse_reply(text)
        turn.thought, turn.code = thought, code
        self._reply = raw_reply(text)
        await self._run_cell(turn, code)  # launchers see the conversation before this action, as in TextWorld
        self.messages.append({"role": "assistant", "content": assistant_message(thought, code)})
        self.messages.append({"role": "user", "content": observation_text(turn.index + 1, turn.output, turn.error)})

    async def _run_cell(self, turn: Turn, code: str) -> None:
        self.run.event("env_start", node=self.node.id, turn=turn.index)
        try:
            r = await self.env.run_cell(self.node.id, code, self._launch)
        finally:
            self.run.event("env_end", node=self.node.id, turn=turn.index)
        turn.output = clean_output(str(r.get("output", "")))
        turn.error = str(r.get("error", ""))
        if r.get("limit"):
            turn.misc["cell_limit"] = r["limit"]
        if r.get("restarted"):
            turn.misc["sandbox_restarted"] = True
        if r.get("invalid_launches"):  # malformed launch_subagent requests: the cell got the error, nothing launched
            turn.misc["invalid_launches"] = int(r["invalid_launches"])
            turn.misc["invalid_launch_errors"] = [str(e)[:200] for e in r.get("invalid_launch_errors", ())]
        turn.reward_misc["reward/success"] = 0.0
        if r.get("finished"):
            status = await self.env.status(self.node.id)
            self.node.finish_message = status["finish_message"]
            check = await self.env.check(self.node.id)
            turn.reward_misc.update({"reward/success": 1.0 if check.success else 0.0, **check.details})
            self.done = True

    async def finish(self) -> None:
        check = await self.env.check(self.node.id)
        success = 1.0 if (check.success and self.node.finish_message is not None) else 0.0
        self.node.env_labels["success"] = success
        self.node.env_labels["reason"] = check.reason
        # The reward is the checker's verdict when the finishing cell ran (recorded on that turn): siblings share the
        # inventory and may spend the agent's crafts before this final check. No cell ran: this check.
        verdicts = [t.reward_misc["reward/success"] for t in self.node.turns if "reward/success" in t.reward_misc]
        self.node.reward = dataclasses.replace(self.node.reward,
                                               environment=float(sum(verdicts)) if verdicts else success)

    # -- launch_subagent --------------------------------------------------------------------------------------
    async def _launch(self, agent_id: str, req: dict) -> str:
        """The cell's ``await launch_subagent(...)``: returns the text the cell receives."""
        run, parent = self.run, self.node
        fork_step = len(parent.turns)  # the current turn is appended after its cell: this is its index
        # The world validated the request once (envs_py/textcraft/world.py subagent_request): its targets are the
        # checked dict and its goal was rendered from them; nothing is parsed back out of the goal text.
        goal = str(req["goal"])
        context = str(req.get("context", ""))
        depth = int(req.get("depth", parent.depth + 1))
        if depth > run.settings.max_depth:
            text = refusal_text(goal, parent.depth, run.settings.max_depth)
            run.record_delegation(DelegationPoint(parent.id, fork_step, [], [goal], context, "refused", text))
            return text
        spec = ChildSpec(run.next_child_id(parent.id, fork_step), goal, depth, run.settings.max_steps,
                         {str(k): int(v) for k, v in dict(req.get("targets") or {}).items()}, context)
        dp = run.record_delegation(DelegationPoint(parent.id, fork_step, [spec.child_id], [goal], context))
        async with run.sibling_order(parent.id):
            request = LaunchRequest(run=run, parent=parent, fork_step=fork_step, specs=[spec],
                                    parent_messages=[dict(m) for m in self.messages], parent_action=self._reply,
                                    env=self.env, start_child=self._start_child)
            outcome = await run.launcher.launch(request)
        dp.kind = outcome.kind
        dp.misc.update(outcome.misc)
        if outcome.texts is not None:
            text = outcome.texts[0]
        else:
            child = outcome.children[0]
            # Remaining = the parent's own budget minus its recorded turns (the current one is not yet counted).
            text = subagent_result_text(child_result(child), len(child.turns), child.max_steps,
                                        parent.max_steps - len(parent.turns))
        dp.result = text
        return text

    async def _start_child(self, spec: ChildSpec, env=None, gate=None) -> Node:
        """Registers ``spec`` in ``env`` (default: this tree's shared world), runs its episode (in ``gate``'s
        lockstep group when given); returns its Node."""
        env = env if env is not None else self.env
        start_inventory = await env.add_agent(spec.child_id, spec.targets or {}, self.node.id)
        misc = {"target_items": dict(spec.targets or {}), "initial_inventory": dict(start_inventory)}
        plan = await env.local_plan(spec.child_id)  # for labels and judges only (docs/design/algorithm.md §1.4)
        misc.update({"local_gold_trajectory": plan} if plan is not None else {"local_gold_unavailable": True})
        child = self.run.new_node(spec.child_id, spec.goal, depth=spec.depth, parent_id=self.node.id,
                                  fork_step=len(self.node.turns), max_steps=spec.max_steps, task_misc=misc)
        episode = CodeActEpisode(self.run, child, env)
        episode.gate = gate
        return await run_episode(episode)


async def open_world(task: Any, *, tree_id: str, pool: Any, settings: Any, rules: str = "reference") -> Any:
    """Returns the handle on a fresh TextCraft tree for ``task`` in ``pool`` (worlds and sandboxes live in env
    workers; ``rules`` is TextWorld's and ignored here)."""
    return await TextCraftTreeEnv.create(pool, tree_id, task, max_steps=settings.max_steps,
                                         sandbox_spares=settings.sandbox_spares, limits=settings.cell_limits)


def root_episode(run: TreeRun, world: Any, task: Any, root_id: str) -> "CodeActEpisode":
    """Returns the root agent's episode (its node, with the task's targets and start inventory, registered in
    ``run``)."""
    root = run.new_node(root_id, task.goal, depth=0, parent_id=None, fork_step=None,
                        max_steps=run.settings.max_steps,
                        task_misc={"target_items": dict(task.payload.get("target_items", {})),
                                   "initial_inventory": dict(task.payload.get("initial_inventory", {}))})
    return CodeActEpisode(run, root, world)
