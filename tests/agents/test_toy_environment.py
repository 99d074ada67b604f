"""A third environment that exists only in this module: a shared counter world and its agent, registered with
``agents.environments.register`` and run through the real runtime (``run_trees``) with a scripted policy, its trees
turned into datums and task-group credit by ``rl``. Nothing in the library names it: the registration is the only
place the runtime, credit assignment and config checks learn about it."""

from __future__ import annotations

import asyncio
import dataclasses
import re
from pathlib import Path

import pytest

from sera_jax.agents.environments import Environment, environment, names, register, unregister
from sera_jax.agents.harness import Episode, TreeRun, run_episode
from sera_jax.agents.launchers.base import ChildSpec, LaunchRequest
from sera_jax.agents.records import DelegationPoint, Node, Turn
from sera_jax.agents.runtime import run_trees
from sera_jax.agents.scripted import ScriptedGenerator
from sera_jax.agents.settings import RuntimeSettings
from sera_jax.rl.baselines import task_group_credit
from sera_jax.rl.datums import delegation_datums, execution_datums
from sera_jax.rl.stages import method_config

NAME = "toy_counter"
DELEGATE = re.compile(r"delegate: [^\n]*")
ADD = re.compile(r"add (\d+)")


@dataclasses.dataclass(frozen=True)
class CounterTask:
    task_id: str
    target: int

    @property
    def goal(self) -> str:
        return f"add {self.target}"


class CounterWorld:
    """One shared integer; every agent's own additions are kept so a sub-agent can be checked against its goal."""

    def __init__(self) -> None:
        self.count, self.added = 0, {}

    async def digest(self) -> str:
        return str(self.count)

    async def state(self) -> dict:
        return {"count": self.count}

    async def close(self) -> None:
        return None


class CounterEpisode(Episode):
    """Replies: ``add K`` (the counter grows by K), ``delegate: add K`` (a sub-agent with that goal), ``finish``."""

    def __init__(self, run: TreeRun, node: Node, world: CounterWorld):
        super().__init__(run, node)
        self.world = world

    async def start(self) -> None:
        self.messages = [{"role": "system", "content": "Reach the goal with add, delegate or finish."},
                         {"role": "user", "content": self.node.goal}]

    async def act(self, turn: Turn, text: str) -> None:
        turn.code = text  # credit assignment finds the delegate line in it
        if text.strip() == "finish":
            self.node.finish_message, self.done = "done", True
        elif (m := DELEGATE.search(text)) is not None:
            turn.output = await self._delegate(turn, m.group(0)[len("delegate: "):])
        elif (m := ADD.search(text)) is not None:
            self.world.count += int(m.group(1))
            self.world.added[self.node.id] = self.world.added.get(self.node.id, 0) + int(m.group(1))
            turn.output = f"count {self.world.count}"
        else:
            turn.error = "unknown reply"
        self.messages += [{"role": "assistant", "content": text}, {"role": "user", "content": turn.output}]

    async def _delegate(self, turn: Turn, goal: str) -> str:
        node, run = self.node, self.run
        spec = ChildSpec(run.next_child_id(node.id, turn.index), goal, node.depth + 1, run.settings.max_steps)
        dp = run.record_delegation(DelegationPoint(node.id, turn.index, [spec.child_id], [goal]))
        outcome = await run.launcher.launch(LaunchRequest(
            run=run, parent=node, fork_step=turn.index, specs=[spec], parent_messages=list(self.messages),
            parent_action=turn.code, env=self.world, start_child=self._start_child))
        dp.kind, dp.result = outcome.kind, f"sub-agent finished: count {self.world.count}"
        return dp.result

    async def _start_child(self, spec: ChildSpec, env=None, gate=None) -> Node:
        child = self.run.new_node(spec.child_id, spec.goal, depth=spec.depth, parent_id=self.node.id,
                                  fork_step=len(self.node.turns), max_steps=spec.max_steps)
        episode = CounterEpisode(self.run, child, self.world)
        episode.gate = gate
        return await run_episode(episode)

    async def finish(self) -> None:
        want = int(ADD.search(self.node.goal).group(1))
        got = self.world.count if self.node.depth == 0 else self.world.added.get(self.node.id, 0)
        success = 1.0 if got == want else 0.0
        self.node.env_labels["success"] = success
        self.node.reward = dataclasses.replace(self.node.reward, environment=success)


async def open_world(task, *, tree_id, pool, settings, rules="reference") -> CounterWorld:
    return CounterWorld()


def root_episode(run: TreeRun, world: CounterWorld, task: CounterTask, root_id: str) -> CounterEpisode:
    root = run.new_node(root_id, task.goal, depth=0, parent_id=None, fork_step=None, max_steps=run.settings.max_steps)
    return CounterEpisode(run, root, world)


def delegate_spans(code: str) -> list[tuple[int, int]]:
    return [m.span() for m in DELEGATE.finditer(code)]


TOY = Environment(
    name=NAME, open_world=open_world, root_episode=root_episode, needs_pool=False,
    runtime_defaults=lambda evaluation: dict(max_prompt_tokens=512, max_context=1024, max_new_tokens=64,
                                             stop_strings=()),
    labels="programmatic", launch_spans=delegate_spans, filter_zero_variance=False,
    task_set_error=lambda task_set, check_paths: None)


@pytest.fixture
def toy():
    register(TOY)
    yield TOY
    unregister(NAME)


# Rollout 0 solves 3 = 2 (its sub-agent) + 1; rollout 1's sub-agent adds 1 instead of 2, so the root misses.
SCRIPTS = {0: {"root": ["delegate: add 2", "add 1", "finish"], "root/subagent-0-0": ["add 2", "finish"]},
           1: {"root": ["delegate: add 2", "add 1", "finish"], "root/subagent-0-0": ["add 1", "finish"]}}


def _trees(tok):
    def script(info, prompt_ids):
        replies = SCRIPTS[int(info.tree_id.rsplit("#", 1)[1])].get(info.node_id, ())
        return replies[info.turn] if info.turn < len(replies) else "finish"

    settings = RuntimeSettings.for_env(NAME)
    return asyncio.run(run_trees([CounterTask("t0", 3)], NAME, ScriptedGenerator(tok, script), tok, settings,
                                 rollouts_per_task=2))


def test_a_registered_environment_runs_through_the_runtime_and_credit(toy, tok):
    assert NAME in names() and environment(NAME) is TOY
    trees = _trees(tok)
    assert [t.misc["env"] for t in trees] == [NAME, NAME] and all("error" not in t.misc for t in trees)
    assert [t.root.env_labels["success"] for t in trees] == [1.0, 0.0]
    assert [t.nodes["root/subagent-0-0"].env_labels["success"] for t in trees] == [1.0, 0.0]
    assert [t.misc["final_digest"] for t in trees] == ["3", "2"]

    ex = execution_datums(trees[0], mode="rao")  # the environment is read from the tree's record
    assert {d.node_id for d in ex} == {"root", "root/subagent-0-0"} and all(d.reward == 1.0 for d in ex)
    dl = delegation_datums(trees[0], tok.decode, env=NAME)
    assert len(dl) == 1 and dl[0].reward == 1.0  # one launch, covering the tree's only leaf
    marked = tok.decode([t for t, m in zip(dl[0].tokens, dl[0].mask) if m])
    assert "delegate" in marked and "finish" not in marked

    credit = task_group_credit("execution", trees, method_config("rao"), env=NAME)
    assert credit.accepted and {round(d.advantage, 6) for d in credit.datums if d.node_id == "root"} == {1.0, -1.0}


def test_an_unregistered_environment_is_refused_naming_the_registered_ones(toy):
    with pytest.raises(ValueError, match=r"unknown env 'minecraft'; expected one of \[.*'toy_counter'\]"):
        RuntimeSettings.for_env("minecraft")
    unregister(NAME)
    with pytest.raises(ValueError, match="unknown env 'toy_counter'"):
        environment(NAME)


def test_the_config_accepts_a_registered_environment(toy):
    from sera_jax.config import ConfigError, load_config
    ROOT = Path(__file__).resolve().parents[2]

    cfg = load_config(ROOT / "configs" / "tiny_cpu.yaml", [f"env.name={NAME}", "eval.rubric_probe_groups=0"])
    assert cfg.env.name == NAME and cfg.execution_filter_zero_variance() is False
    unregister(NAME)
    with pytest.raises(ConfigError, match=r"env.name: expected one of \['textcraft', 'textworld_sync'\], got 'toy"):
        load_config(ROOT / "configs" / "tiny_cpu.yaml", [f"env.name={NAME}"])
