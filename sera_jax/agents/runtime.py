"""Top level of the recursive runtime: run one tree, or many concurrently, against a Generator.

How train.py / evaluate.py call it (one event loop per host process)::

    settings = RuntimeSettings.for_env("textcraft", evaluation=False, seed=run_seed, policy_version=v)
    pool = await start_pool(workers=8)                      # env worker processes on this host
    trees = await run_trees(tasks, "textcraft", engine, tokenizer, settings, rollouts_per_task=8, pool=pool,
                            max_concurrent=64, pinning=Pinning(num_hosts, host_index),
                            launcher_factory=make_launcher_factory(stage, method, env))  # agents.launchers
    write_jsonl(trees, path)                                # records.py; credit assignment reads these
    await pool.close()

Every agent turn awaits ``generator.generate`` (the engine batches all pending turns of all trees); env work runs in
env worker processes (``envs_py.workers.WorkerPool``) and prompt encoding in a thread, so neither blocks the event
loop. Each tree's root key is derived from (seed, policy version, task id, rollout index) unless a key is given;
each turn folds in the node path and the turn index. ``RuntimeSettings.deterministic`` makes a tree replay exactly
from its seed (sibling groups in lockstep ticks, acting in launch order; see ``lockstep.py``).

Multi-host: each host process runs its own engine, its own WorkerPool and this runtime over the trees ``Pinning``
assigns to it (``Pinning(num_hosts, host_index).local(items)``); nothing here is shared across hosts.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
from typing import Any, Callable, Iterable, Sequence

import jax

from envs_py.workers import WorkerPool
from sera_jax.agents import infra
from sera_jax.agents.environments import environment
from sera_jax.agents.envs import runtime_factories
from sera_jax.agents.harness import Trace, TreeRun, run_episode
from sera_jax.agents.keys import stable_hash, tree_key
from sera_jax.agents.launchers.base import DefaultLauncher
from sera_jax.agents.records import Tree
from sera_jax.agents.settings import RuntimeSettings
from sera_jax.sampling.simulation import label as simulation_label
from sera_jax.sampling.types import Generator

ROOT_ID = "root"


@dataclasses.dataclass(frozen=True)
class Pinning:
    """Which host runs which tree: a stable hash of (task id, rollout index) modulo the number of hosts, so every
    host computes the same assignment without talking to the others."""

    num_hosts: int = 1
    host_index: int = 0

    def host_of(self, task_id: str, rollout_index: int) -> int:
        """Returns the host index a tree is pinned to."""
        return stable_hash(f"{task_id}#{rollout_index}") % self.num_hosts

    def local(self, items: Iterable[tuple[Any, int]]) -> list[tuple[Any, int]]:
        """Returns the (task, rollout index) pairs pinned to this host, in input order."""
        return [(t, r) for t, r in items if self.host_of(str(t.task_id), r) == self.host_index]


async def start_pool(workers: int = 1):
    """Returns a started env WorkerPool that knows the runtime's env factories (close it with ``await .close()``)."""
    return await WorkerPool(workers, factories=runtime_factories()).start()


def default_tree_id(task_id: str, rollout_index: int) -> str:
    """Returns the tree id used when none is given: ``<task id>#<rollout index>``."""
    return f"{task_id}#{rollout_index}"


async def run_tree(task: Any, env_name: str, generator: Generator, tokenizer: Any, settings: RuntimeSettings,
                   key: jax.Array | None = None, *, rollout_index: int = 0, pool: Any = None, launcher: Any = None,
                   trace: Trace | None = None, tree_id: str | None = None, textworld_rules: str = "reference") -> Tree:
    """Runs one root rollout of ``task`` and returns its Tree record (also when agents failed: their nodes carry
    the error and ``rollout_error_zero_reward``; a tree timeout is recorded in ``tree.misc["error"]``).

    ``pool``: a WorkerPool from :func:`start_pool` (an environment registered with ``needs_pool``, TextCraft, always
    needs one; one is started and closed here when missing). TextWorld runs in that pool when given, else
    in-process. ``launcher``: the delegation strategy
    (default :class:`DefaultLauncher`). ``key``: the tree's root key (default: derived from the settings' seed and
    policy version, the task id and ``rollout_index``).
    """
    if env_name != settings.env:
        raise ValueError(f"settings are for {settings.env!r}, not {env_name!r}")
    own_pool = None
    if pool is None and environment(env_name).needs_pool:
        pool = own_pool = await start_pool(1)
    try:
        return await _run_tree(task, env_name, generator, tokenizer, settings, key, rollout_index, pool,
                               launcher or DefaultLauncher(), trace, tree_id, textworld_rules)
    finally:
        if own_pool is not None:
            await own_pool.close()


async def _run_tree(task, env_name, generator, tokenizer, settings, key, rollout_index, pool, launcher, trace,
                    tree_id, textworld_rules) -> Tree:
    task_id = str(task.task_id)
    tree = Tree(id=tree_id or default_tree_id(task_id, rollout_index), task_id=task_id, root_id=ROOT_ID,
                root_rollout_index=rollout_index, policy_version=settings.policy_version,
                misc={"env": env_name, "difficulty": str(getattr(task, "difficulty", "")), "seed": settings.seed,
                      "deterministic": settings.deterministic, **simulation_label()})
    root_key = key if key is not None else tree_key(settings.seed, settings.policy_version, task_id, rollout_index)
    run = TreeRun(tree, generator, tokenizer, settings, root_key, launcher, trace)
    env = None
    try:
        spec = environment(env_name)  # its world and root agent (agents/environments)
        env = await spec.get("open_world")(task, tree_id=tree.id, pool=pool, settings=settings,
                                           rules=textworld_rules)
        episode = spec.get("root_episode")(run, env, task, ROOT_ID)
        try:
            await asyncio.wait_for(run_episode(episode), settings.tree_timeout_s)
        except asyncio.TimeoutError:
            tree.misc["error"] = f"tree timeout after {settings.tree_timeout_s:g} s"
            for node in tree.nodes.values():
                node.rollout_error_zero_reward = True  # zeroes the node's reward when read
        try:
            tree.misc["final_digest"] = await env.digest()
        except Exception as e:  # noqa: BLE001  (a dead worker: the nodes already carry the error)
            tree.misc["final_digest_error"] = f"{type(e).__name__}: {e}"
    except Exception as e:  # noqa: BLE001  (the world could not even be created: a failed, recorded tree)
        tree.misc["error"] = f"{type(e).__name__}: {e}"
        if env is None or infra.reason(e):  # no world, or its host failed: not the policy's doing
            infra.mark_tree(tree, ("world not created: " if env is None else "") + tree.misc["error"])
        if ROOT_ID not in tree.nodes:
            run.new_node(ROOT_ID, str(getattr(task, "goal", "")), depth=0, parent_id=None, fork_step=None,
                         max_steps=settings.max_steps)
        tree.root.error_message = tree.misc["error"]
        tree.root.rollout_error_zero_reward = True
    finally:
        if env is not None:
            try:
                await env.close()
            except Exception:  # noqa: BLE001  (freeing a failed tree's world may fail too; nothing to keep)
                pass
    infra.mark_tree(tree)  # a node failed by its env host marks the tree (kept out of credit)
    tree.misc["stats"] = tree_stats(tree)
    return tree


def tree_stats(tree: Tree) -> dict:
    """Returns counts over a tree: nodes, successful nodes, deepest depth, turns, generated turns and tokens,
    delegations (accepted / refused), direct children of the root, agents that ended with an error, malformed
    launch requests and cells stopped at a limit."""
    nodes = list(tree.nodes.values())
    turns = [t for n in nodes for t in n.turns]
    # A served model's own counts (its ``usage``): its text is re-encoded here, which may split differently. A turn
    # whose prompt the server counts otherwise than the ids recorded saw other tokens than the tree says.
    metered = [(t, t.misc["usage"]) for t in turns if isinstance(t.misc.get("usage"), dict)]
    served = [u for _, u in metered]
    usage = {"served_completion_tokens": sum(int(u.get("completion_tokens", 0)) for u in served),
             "served_prompt_tokens": sum(int(u.get("prompt_tokens", 0)) for u in served),
             "unmetered_turns": sum(1 for u in served if not u.get("metered", True)),
             "prompt_mismatch_turns": sum(1 for t, u in metered if u.get("metered", True)
                                          and int(u.get("prompt_tokens", -1)) != len(t.prompt_ids))} if served else {}
    return {
        "nodes": len(nodes), "subagent_nodes": len(nodes) - 1,
        "successful_nodes": sum(1 for n in nodes if n.env_labels.get("success") == 1.0),
        "max_depth": max((n.depth for n in nodes), default=0), "turns": len(turns),
        "generated_turns": sum(1 for t in turns if t.completion_id is not None),
        "completion_tokens": sum(len(t.completion_ids) for t in turns),
        "delegations": sum(1 for d in tree.delegations if d.kind != "refused"),
        "refused_delegations": sum(1 for d in tree.delegations if d.kind == "refused"),
        "root_direct_children": sum(1 for n in nodes if n.parent_id == tree.root_id),
        "agent_errors": sum(1 for n in nodes if n.rollout_error_zero_reward),
        # What the policy's cells tried that the host refused: launch requests the world found malformed (the cell
        # got the error, nothing launched), and cells stopped at a limit (time, CPU, output, memory).
        "invalid_launches": sum(int(t.misc.get("invalid_launches", 0)) for t in turns),
        "cell_limit_stops": sum(1 for t in turns if t.misc.get("cell_limit")),
        **usage,
    }


async def run_trees(tasks: Sequence[Any], env_name: str, generator: Generator, tokenizer: Any,
                    settings: RuntimeSettings, *, rollouts_per_task: int = 1, pool: Any = None,
                    max_concurrent: int = 64, pinning: Pinning | None = None,
                    launcher_factory: Callable[[Any, int], Any] | None = None, trace: Trace | None = None,
                    textworld_rules: str = "reference") -> list[Tree]:
    """Runs ``rollouts_per_task`` trees of every task (only those pinned to this host), at most ``max_concurrent``
    at a time, all against ``generator``; returns the Trees in (task, rollout) order.

    ``launcher_factory(task, rollout_index)`` gives each tree its launcher (default: DefaultLauncher). A pool is
    started (and closed) here when none is given and the env needs one.
    """
    items = [(t, r) for t in tasks for r in range(rollouts_per_task)]
    if pinning is not None:
        items = pinning.local(items)
    own_pool = None
    if pool is None and environment(env_name).needs_pool:
        pool = own_pool = await start_pool(1)
    gate = asyncio.Semaphore(max_concurrent)

    # A generator of several engines (sampling.replicas) pins each tree to one, so its turns reuse that engine's
    # prefix cache; inside an outer pin (a task group's) the tree keeps the outer engine.
    pin = getattr(generator, "pinned", None) or contextlib.nullcontext

    async def one(task, r):
        async with gate:
            with pin():
                launcher = launcher_factory(task, r) if launcher_factory is not None else None
                return await run_tree(task, env_name, generator, tokenizer, settings, rollout_index=r, pool=pool,
                                      launcher=launcher, trace=trace, textworld_rules=textworld_rules)

    try:
        return list(await asyncio.gather(*(one(t, r) for t, r in items)))
    finally:
        if own_pool is not None:
            await own_pool.close()
