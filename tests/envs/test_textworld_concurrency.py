"""Shared-state concurrency, atomic commits, snapshot / fork / commit and the state digest
(docs/design/textworld.md §6)."""

import asyncio
import random
import threading

from envs_py.textworld_sync import Coordinator, load_tasks, make_world, oracle_actions
from envs_py.textworld_sync.solver import replay

TASKS = {t.task_id.rsplit("_test_", 1)[1]: t for t in load_tasks("sample")}
JUNK = ["take the moon", "Take salt", "dice", "", "   ", "eat dish_9", "prepare dish_1", "open door",
        "cook salt in stove", "go to kitchen", "LOOK AROUND", "inventory", "take knife"]


def _choose(rng, infos):
    return rng.choice(infos["validActions"]) if rng.random() < 0.75 else rng.choice(JUNK)


def _replay_events(task, events, agents, rules="reference"):
    world = make_world(task, rules)
    for agent in agents:
        world.add_agent(agent)
    for event in events:
        world.step(event["agent_id"], event["action"])
    return world


def _check_no_lost_update(coord, expected_calls):
    events = coord.get_events()
    assert coord.steps == expected_calls == len(events)
    assert [e["sequence"] for e in events] == list(range(1, expected_calls + 1))
    world = coord.world
    for i, name in enumerate(world.c.names):
        takes = [e for e in events if e["accepted"] and e["action"] == f"take {name}"]
        assert len(takes) == int(world.collected[i])  # a raced take is accepted exactly once


def test_async_agents_serialise_to_the_event_log():
    for key in ("load_balanced_medium_0022", "conflict_hard_0022", "multi_dish_fork_join_easy_0003"):
        task = TASKS[key]
        coord = Coordinator(task)
        agents = ["root"] + [f"root/subagent-0-{k}" for k in range(5)]
        views = [coord.fork_shared(a) for a in agents]
        per_agent = 40

        async def run(view, seed):
            rng = random.Random(seed)
            for _ in range(per_agent):
                _obs, infos = await view.observe_async()
                await asyncio.sleep(0)  # others commit in between: the valid list may go stale
                await view.step(_choose(rng, infos))
                await asyncio.sleep(0)

        async def main():
            await asyncio.gather(*(run(v, n) for n, v in enumerate(views)))

        asyncio.run(main())
        _check_no_lost_update(coord, per_agent * len(agents))
        events = coord.get_events()
        assert len({e["agent_id"] for e in events}) == len(agents)
        replayed = _replay_events(task, events, agents)
        assert replayed.digest() == coord.digest()
        assert replayed.get_events() == events
        assert any(not e["accepted"] for e in events) and any(e["accepted"] for e in events)


def test_threads_hammering_one_coordinator_lose_no_update():
    task = TASKS["resource_constrained_hard_0023"]
    coord = Coordinator(task)
    agents = [f"agent-{k}" for k in range(6)]
    for a in agents:
        coord.fork_shared(a)
    per_agent = 300

    def run(agent, seed):
        rng = random.Random(seed)
        for _ in range(per_agent):
            _obs, infos = coord.observe_sync(agent)
            coord.step_sync(agent, _choose(rng, infos))

    threads = [threading.Thread(target=run, args=(a, n)) for n, a in enumerate(agents)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    _check_no_lost_update(coord, per_agent * len(agents))
    replayed = _replay_events(task, coord.get_events(), ["root"] + agents)
    assert replayed.digest() == coord.digest()


def test_concurrent_oracle_sub_agents_solve_every_sample():
    from envs_py.textworld_sync.solver import run_oracle_concurrent, split_assignment

    for task in TASKS.values():
        coord = Coordinator(task)
        assignment = split_assignment(coord.world.c.dish_ids, 3)
        asyncio.run(run_oracle_concurrent(coord, assignment))
        assert coord.check().success and coord.steps <= task.max_steps, task.task_id
        assert {e["agent_id"] for e in coord.get_events()} == set(assignment)


def test_fork_is_isolated_and_commit_adopts_the_branch():
    task = TASKS["dependency_gate_medium_0021"]
    world = make_world(task)
    world.step("root", "open door")
    before = world.digest()
    branch = world.fork()
    assert branch.digest() == before
    for action in oracle_actions(task)[:12]:
        branch.step("root", action)
    branch.add_agent("root/subagent-1-0")
    assert world.digest() == before and branch.digest() != before
    assert len(world.get_events()) == 1 and len(branch.get_events()) == 13
    world.commit(branch)
    assert world.digest() == branch.digest() and world.get_events() == branch.get_events()
    branch.step("root", "look around")  # the committed state is a copy, not shared with the branch
    assert world.digest() != branch.digest() and world.steps == 13


def test_coordinator_fork_and_commit():
    task = TASKS["conflict_hard_0023"]
    coord = Coordinator(task)
    coord.step_sync("root", "open door")
    branches = [coord.fork() for _ in range(3)]
    for n, branch in enumerate(branches):
        for action in oracle_actions(task)[: 5 * (n + 1)]:
            branch.step_sync("root", action)
    assert len({b.digest() for b in branches}) == 3
    assert coord.steps == 1
    coord.commit(branches[1])
    assert coord.digest() == branches[1].digest()
    snap = coord.snapshot()
    coord.step_sync("root", "look around")
    assert snap.digest() != coord.digest()


def test_digest_tracks_state_and_replay():
    task = TASKS["multi_dish_fork_join_easy_0010"]
    actions = oracle_actions(task)
    a, b = replay(task, actions), replay(task, actions)
    assert a.digest() == b.digest()
    c = replay(task, actions[:-1])
    assert c.digest() != a.digest()
    d = make_world(task)
    d.add_agent("x")
    assert d.digest() != make_world(task).digest()  # agent locations are state
    full = make_world(task, rules="full")
    assert full.digest() != make_world(task).digest()
