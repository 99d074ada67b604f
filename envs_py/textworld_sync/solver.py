"""Oracle solvers for TextWorld-Sync: one agent, or the dishes split over several agents.

The oracle reads the world's hidden state (it knows every recipe) and picks, each global step, an action that
makes progress: open the gate when its dishes need it, apply the next required preparation to an item in the
shared inventory, prepare / eat a finished dish, take an owned item here, or walk to a room that still holds one.
It handles one non-trivial item at a time, which never waits on a tool cooldown (a take always separates two uses
of a tool). Used by the tests and by warm-start data generation.
"""

from __future__ import annotations

from typing import Any, Iterable, Mapping

from envs_py.textworld_sync.world import ROOT, World, make_world


def _owned_indices(world: World, dish_ids: Iterable[str]) -> set[int]:
    wanted = set(dish_ids)
    unknown = wanted - set(world.c.dish_ids)
    if unknown:
        raise ValueError(f"unknown dish ids: {sorted(unknown)}")
    return {d for d, dish_id in enumerate(world.c.dish_ids) if dish_id in wanted}


def next_action(world: World, agent_id: str, dishes: set[int]) -> str | None:
    """Returns the oracle's next action for `agent_id` working on dish indices `dishes`, or None when it has
    nothing useful to do right now (its work is finished, or it must wait for the inventory or a tool)."""
    c = world.c
    room = world.agent_locations.get(agent_id, "kitchen")
    valid = world._valid(room)
    owned_items = [i for d in dishes for i in c.dish_items[d]]
    if not world.gate_open and any(c.gated[i] and not world.collected[i] for i in owned_items):
        return "open door"
    holding = False
    for i in world.inventory:
        if c.dish_of[i] in dishes:
            holding = True
            have, expected = world.actual[i], c.expected[i]
            for cmd, word, _tool in c.prep_cmds[i]:
                if word in expected and word not in have and cmd in valid:
                    return cmd
    for d in sorted(dishes):
        if c.eat_cmd[d] in valid:
            return c.eat_cmd[d]
        if c.prepare_cmd[d] in valid:
            return c.prepare_cmd[d]
    if holding:
        return None  # finish the item in hand first (it waits on a tool cooldown)
    pending = [i for i in owned_items if not world.collected[i] and (world.gate_open or not c.gated[i])]
    here = [i for i in pending if c.start[i] == room]
    for i in here:
        if c.take_cmd[i] in valid:
            return c.take_cmd[i]
    if here:
        return None  # the shared inventory is full: wait here rather than walk away
    for target in c.rooms:
        if target != room and any(c.start[i] == target for i in pending):
            return f"go to {target}"
    return None


def run_oracle(world: World, assignment: Mapping[str, Iterable[str]], max_steps: int | None = None
               ) -> list[tuple[str, str]]:
    """Drives `world` with oracle agents, `assignment` mapping agent id -> dish ids it owns; agents take turns
    round-robin and skip a turn when they have nothing useful to do. Stops on success, failure, or after
    `max_steps` global steps (default: the task's budget). Returns the committed (agent_id, action) list."""
    owned = {agent: _owned_indices(world, dishes) for agent, dishes in assignment.items()}
    for agent in owned:
        world.add_agent(agent)
    agents = list(owned)
    limit = world.limit if max_steps is None else max_steps
    log: list[tuple[str, str]] = []
    turn = 0
    while world.steps < limit and not world.failure:
        if all(world.meal_eaten[d] for dishes in owned.values() for d in dishes):
            break
        chosen = None
        for k in range(len(agents)):
            agent = agents[(turn + k) % len(agents)]
            action = next_action(world, agent, owned[agent])
            if action is not None:
                chosen = (agent, action)
                turn = (turn + k + 1) % len(agents)
                break
        if chosen is None:
            # Everyone is blocked (a tool is cooling down): let time pass with a no-op.
            busy = [a for a in agents if any(not world.meal_eaten[d] for d in owned[a])]
            chosen = (busy[0] if busy else agents[0], "look around")
        world.step(*chosen)
        log.append(chosen)
        if world.success():
            break
    return log


async def run_oracle_concurrent(coordinator: Any, assignment: Mapping[str, Iterable[str]],
                                max_rounds: int = 10_000) -> None:
    """Runs one asyncio oracle agent per entry of `assignment` (agent id -> dish ids) concurrently on a
    Coordinator; each decides and commits inside one transaction. Returns when the world is done or every agent
    has finished its dishes."""
    import asyncio

    dish_ids = coordinator.world.c.dish_ids

    async def agent_loop(agent: str, dishes: Iterable[str]) -> None:
        coordinator.fork_shared(agent)
        owned = {dish_ids.index(d) for d in dishes}
        idle_since = None
        for _ in range(max_rounds):  # bounded, so a bug cannot hang the caller
            async with coordinator.transaction() as world:
                if world.done or all(world.meal_eaten[d] for d in owned):
                    return
                action = next_action(world, agent, owned)
                if action is None and idle_since == world.steps:
                    action = "look around"  # nobody acted for a whole round: let a tool cool down
                idle_since = world.steps if action is None else None
                if action is not None:
                    world.step(agent, action)
            await asyncio.sleep(0)

    await asyncio.gather(*(agent_loop(a, d) for a, d in assignment.items()))


def oracle_actions(task: Any, rules: str = "reference") -> list[str]:
    """Returns a single-agent ('root') action list that solves `task` (checked by simulation)."""
    world = make_world(task, rules)
    return [action for _agent, action in run_oracle(world, {ROOT: world.c.dish_ids})]


def split_assignment(dish_ids: list[str], n_agents: int, parent: str = ROOT) -> dict[str, list[str]]:
    """Returns dishes dealt round-robin to n_agents sub-agents '<parent>/subagent-0-<k>'."""
    if n_agents < 1:
        raise ValueError("n_agents must be >= 1")
    agents = [f"{parent}/subagent-0-{k}" for k in range(min(n_agents, len(dish_ids)))]
    out: dict[str, list[str]] = {a: [] for a in agents}
    for d, dish_id in enumerate(dish_ids):
        out[agents[d % len(agents)]].append(dish_id)
    return out


def oracle_split_actions(task: Any, n_agents: int = 2, rules: str = "reference") -> list[tuple[str, str]]:
    """Returns an (agent_id, action) list that solves `task` with its dishes split over n_agents sub-agents."""
    world = make_world(task, rules)
    return run_oracle(world, split_assignment(world.c.dish_ids, n_agents))


def replay(task: Any, steps: Iterable[Any], rules: str = "reference") -> World:
    """Returns a fresh world after committing `steps` (actions for 'root', or (agent_id, action) pairs) serially."""
    world = make_world(task, rules)
    for step in steps:
        agent, action = (ROOT, step) if isinstance(step, str) else step
        world.add_agent(agent)
        world.step(agent, action)
    return world
