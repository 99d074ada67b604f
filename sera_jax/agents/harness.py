"""One agent's loop and the state a running tree shares (docs/design/algorithm.md §1.1–1.3, §1.6).

``TreeRun`` holds what every agent of one tree uses: the record being written (``Tree``), the generator, the
tokenizer, the settings, the tree's root PRNG key, the launcher (invoked at every delegation, see ``launcher.py``)
and a ``Trace`` (``trace.py``: the one given, else the active one, else none). ``run_episode(episode)`` drives one
agent: budget check, loop breaker, one policy turn (prompt truncation → ``generator.generate`` → decode), the
environment-specific action, then the Turn is appended.
Environment specifics live in ``Episode`` subclasses (``codeact.py``, ``textworld.py``).

Untrusted model output never raises out of here: malformed replies are handled by the episodes as turn errors, and
anything else that goes wrong inside an agent's loop (a dead env worker, a generator error, a timeout) ends that agent
with ``error_message`` = ``Error in episode loop at step N: …`` and ``rollout_error_zero_reward`` (docs/design/algorithm.md §1.2).
"""

from __future__ import annotations

import abc
import asyncio
import contextlib
import contextvars
import dataclasses
import traceback
from typing import Any

import jax

from sera_jax.agents import infra
from sera_jax.agents.keys import turn_key
from sera_jax.agents.phases import (  # Trace re-exported: callers import it from here
    Trace,
    current_trace,
    span,
)
from sera_jax.agents.records import DelegationPoint, Node, Tree, Turn
from sera_jax.agents.settings import RuntimeSettings
from sera_jax.agents.truncation import Prompt, build_prompt, continue_prompt
from sera_jax.sampling.types import Generator


@dataclasses.dataclass(frozen=True)
class TurnInfo:
    """Who is generating: set in ``CURRENT_TURN`` around every ``generate`` call (test doubles and tracing read it)."""

    tree_id: str
    node_id: str
    turn: int
    depth: int


CURRENT_TURN: contextvars.ContextVar[TurnInfo | None] = contextvars.ContextVar("sera_current_turn", default=None)


def child_agent_id(parent_id: str, step_index: int, child_index: int) -> str:
    """Returns a sub-agent's id (and node path): ``<parent>/subagent-<parent step>-<child index>``."""
    return f"{parent_id}/subagent-{step_index}-{child_index}"


class TreeRun:
    """The shared state of one running tree (one per root rollout)."""

    def __init__(self, tree: Tree, generator: Generator, tokenizer: Any, settings: RuntimeSettings,
                 root_key: jax.Array, launcher: Any, trace: Trace | None = None):
        self.tree, self.generator, self.tokenizer, self.settings = tree, generator, tokenizer, settings
        self.root_key, self.trace = root_key, trace if trace is not None else current_trace()
        self.launcher = _TracedLauncher(launcher, self) if launcher is not None else None
        self.stop_ids = tuple(tokenizer.stop_ids)
        self._child_counts: dict[tuple[str, int], int] = {}
        self._last_prompt: dict[str, tuple[Prompt, list[int]]] = {}  # node id -> (last prompt, its completion)
        self._sibling_locks: dict[str, asyncio.Lock] = {}

    def event(self, kind: str, **fields: Any) -> None:
        if self.trace is not None:
            self.trace.add(kind, tree=self.tree.id, **fields)

    def span(self, kind: str, **fields: Any):
        """Returns a context manager recording a ``kind`` span of this tree (a no-op without a trace)."""
        return span(kind, self.trace, tree=self.tree.id, **fields) if self.trace is not None \
            else contextlib.nullcontext()

    # -- nodes -----------------------------------------------------------------------------------------------
    def new_node(self, node_id: str, goal: str, *, depth: int, parent_id: str | None, fork_step: int | None,
                 max_steps: int, task_misc: dict | None = None) -> Node:
        """Returns a fresh Node registered in the tree record."""
        if node_id in self.tree.nodes:
            raise ValueError(f"node {node_id!r} already exists in tree {self.tree.id!r}")
        node = Node(id=node_id, goal=goal, task_id=self.tree.task_id, max_steps=max_steps,
                    task_misc=dict(task_misc or {}), depth=depth, parent_id=parent_id, fork_step=fork_step)
        self.tree.nodes[node_id] = node
        return node

    def next_child_id(self, parent_id: str, fork_step: int) -> str:
        """Returns the next child id of a parent step (children of one step are numbered in launch order)."""
        k = self._child_counts.get((parent_id, fork_step), 0)
        self._child_counts[(parent_id, fork_step)] = k + 1
        return child_agent_id(parent_id, fork_step, k)

    def sibling_order(self, parent_id: str):
        """Returns a context manager that, in deterministic mode, runs the launches of one parent one after
        another in arrival order (asyncio locks are FIFO); otherwise it does nothing."""
        if not self.settings.deterministic:
            return contextlib.nullcontext()
        return self._sibling_locks.setdefault(parent_id, asyncio.Lock())

    def record_delegation(self, dp: DelegationPoint) -> DelegationPoint:
        """Appends a delegation point to the tree record (in launch order) and returns it."""
        self.tree.delegations.append(dp)
        return dp

    # -- one policy turn -------------------------------------------------------------------------------------
    async def policy_turn(self, node: Node, messages: list[dict]) -> tuple[Turn, str]:
        """Generates one turn of ``node`` from ``messages`` (truncated in place to the post-deletion list, §1.3).

        Returns the Turn (prompt ids as sent, completion ids, behaviour logprobs, policy version; the action and
        observation fields still empty) and the completion text with special tokens removed, for parsing."""
        s, tok = self.settings, self.tokenizer
        last = self._last_prompt.get(node.id) if s.token_history else None
        prompt = continue_prompt(tok, *last, messages, s.max_prompt_tokens) if last is not None else None
        if prompt is None:
            # Encoding a long prompt is milliseconds of CPU: off the event loop, so other agents keep going.
            prompt = await asyncio.to_thread(build_prompt, tok, messages, s.max_prompt_tokens)
        messages[:] = prompt.messages
        params = s.sampling(self.stop_ids, len(prompt.ids))
        index = len(node.turns)
        key = turn_key(self.root_key, node.id, index)
        info = TurnInfo(self.tree.id, node.id, index, node.depth)
        token = CURRENT_TURN.set(info)
        try:
            with self.span("generate", node=node.id, turn=index):
                result = await asyncio.wait_for(self.generator.generate(prompt.ids, params, key), s.step_timeout_s)
        finally:
            CURRENT_TURN.reset(token)
        ids = [int(t) for t in result.token_ids]
        logprobs = [float(x) for x in result.logprobs]
        if s.token_history:
            self._last_prompt[node.id] = (prompt, ids)
        turn = Turn(index=index, prompt_ids=list(prompt.ids), completion_ids=ids, logprobs=logprobs,
                    policy_version=int(result.policy_version), completion_id=f"{self.tree.id}:{node.id}:{index}",
                    completion_text=tok.decode(ids),
                    misc={"finish_reason": result.finish_reason, "prompt_len": len(prompt.ids), **prompt.info(),
                          **({"usage": dict(result.usage)} if result.usage is not None else {})})
        return turn, tok.decode(ids, skip_special_tokens=True)


class _TracedLauncher:
    """The tree's launcher with every ``launch`` recorded as a ``launch`` span of the delegating agent: a TextCraft
    cell that calls ``launch_subagent`` waits inside its env span for the whole child, and the phase timing
    (``trace.phase_times``) takes that wait out of the parent's env time. Other attributes pass through."""

    def __init__(self, inner: Any, run: "TreeRun"):
        self.inner, self._run = inner, run

    async def launch(self, request: Any) -> Any:
        with self._run.span("launch", node=request.parent.id, turn=request.fork_step):
            return await self.inner.launch(request)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


class Episode(abc.ABC):
    """One agent's environment-specific behaviour; ``run_episode`` calls these hooks.

    Subclasses set ``messages`` in ``start`` and implement ``act``; ``done`` ends the loop after the current turn.
    """

    exhausted_message: str | None = None

    def __init__(self, run: TreeRun, node: Node):
        self.run, self.node = run, node
        self.messages: list[dict] = []
        self.done = False
        self.gate = None  # a lockstep.Lockstep when this agent runs in a deterministic sibling group

    @abc.abstractmethod
    async def start(self) -> None:
        """Builds the system and task messages (each environment's episode defines it)."""

    async def before_turn(self) -> bool:
        """Returns True when the agent must stop before generating (e.g. the shared world is done)."""
        return False

    def stuck(self) -> bool:
        """Returns True when the loop breaker fires instead of a policy turn (default: never)."""
        return False

    async def loop_break(self) -> None:
        """Appends the loop breaker's synthetic turn (called when ``stuck()``)."""

    @abc.abstractmethod
    async def act(self, turn: Turn, text: str) -> None:
        """Parses ``text``, acts on the environment, fills the turn's action/observation fields and extends
        ``messages`` with the assistant reply and the next user message (each environment's episode defines it)."""

    async def finish(self) -> None:
        """Writes the node's labels (env success, finish/result facts) once the loop has ended."""


async def run_episode(ep: Episode) -> Node:
    """Runs one agent to its end (finish, budget, loop breaker, env done or error); returns its Node.

    Never raises for anything but cancellation: errors are recorded on the node (§1.2). With ``ep.gate`` set, each
    turn is one lockstep tick (observe, generate, act in the group's order) and the exit takes a slot too."""
    node, run, gate = ep.node, ep.run, ep.gate
    ticks = 0  # ticks this agent has finished (its turn count within the group)
    run.event("agent_start", node=node.id)
    try:
        try:
            if gate is not None:
                await gate.begin(node.id, 0)
            await ep.start()
            while not ep.done:
                if gate is not None:
                    await gate.begin(node.id, ticks)
                if len(node.turns) >= node.max_steps:
                    if ep.exhausted_message is not None and node.finish_message is None:
                        node.error_message = ep.exhausted_message
                    break
                if await ep.before_turn():
                    break
                if gate is not None:
                    gate.observe_done(node.id)
                stuck = ep.stuck()
                if not stuck:
                    turn, text = await run.policy_turn(node, ep.messages)
                if gate is not None:
                    await gate.slot(node.id)
                if stuck:
                    await ep.loop_break()
                    break
                # The turn joins the node only after its action ran: a launch from it sees fork_step = its index.
                await ep.act(turn, text)
                node.turns.append(turn)
                if gate is not None:
                    gate.done(node.id)
                    ticks += 1
        except Exception as e:  # noqa: BLE001  (recorded: the trajectory is kept and scores 0, docs/design/algorithm.md §1.2)
            node.error_message = (f"Error in episode loop at step {len(node.turns)}: {type(e).__name__}: {e}\n"
                                  + "".join(traceback.format_exception(e)))
            node.rollout_error_zero_reward = True
            infra.mark_node(node, e)  # a dead env worker is not the policy's failure (agents/infra.py)
        if gate is not None:  # the final observation is read in this agent's slot of the next tick
            await gate.begin(node.id, ticks)
            gate.observe_done(node.id)
            await gate.slot(node.id)
        try:
            await ep.finish()
        except Exception as e:  # noqa: BLE001  (labels unavailable, e.g. the env worker died)
            node.misc["label_error"] = f"{type(e).__name__}: {e}"
            node.rollout_error_zero_reward = True
            infra.mark_node(node, e)
            node.env_labels.setdefault("success", 0.0)  # the reward is zeroed by the flag when read
    finally:
        if gate is not None:
            gate.leave(node.id)
    run.event("agent_end", node=node.id)
    return node
