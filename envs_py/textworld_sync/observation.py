"""Observation text and `infos` of TextWorld-Sync, exactly as docs/design/textworld.md §8 lays them out."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:  # pragma: no cover
    from envs_py.textworld_sync.world import World


def counter_names(world: "World") -> list[str]:
    """Returns the sorted names of the ingredients on the shared prepared counter."""
    names = world.c.names
    return sorted(names[i] for i, ready in enumerate(world.ready) if ready)


def inventory_text(world: "World") -> str:
    """Returns the shared inventory as ', '-joined names in inventory order, or '(empty)'."""
    names = world.c.names
    return ", ".join(names[i] for i in world.inventory) if world.inventory else "(empty)"


def render(world: "World", room: str) -> tuple[str, dict]:
    """Returns (observation text, infos) for an agent standing in `room`."""
    c = world.c
    collected, gated, names = world.collected, c.gated, c.names
    gate_open = world.gate_open
    visible = [names[i] for i in c.room_items[room] if not collected[i] and (gate_open or not gated[i])]
    cooling = world.cooldowns
    cooldown_text = ", ".join(f"{t}:{n}" for t, n in sorted(cooling.items())) if cooling else "none"
    counter = counter_names(world)
    lines = [
        f"You are in the {room}.",
        "Visible objects: " + (", ".join(visible) if visible else "(none)"),
        f"Shared kitchen gate: {'open' if gate_open else 'closed'}.",
        f"Shared tool cooldowns: {cooldown_text}.",
        "Shared prepared counter: " + (", ".join(counter) if counter else "(empty)"),
        "Dish progress:",
    ]
    prepared, eaten, ready_count = world.meal_prepared, world.meal_eaten, world.ready_count
    completed = 0
    for d, dish_id in enumerate(c.dish_ids):
        lines.append(
            f"- {dish_id}: {ready_count[d]}/{len(c.dish_items[d])} ingredients prepared, "
            f"meal_prepared={prepared[d]}, meal_eaten={eaten[d]}"
        )
        completed += eaten[d]
    remaining = max(c.limit - world.steps, 0)
    lines.append(f"Shared steps remaining: {remaining}")
    lines.append("Valid Actions are listed below.")
    success = world.success()
    failure = world.failure or world.invalid
    infos = {
        "validActions": world._valid(room),
        "inventory": inventory_text(world),
        "score": 1.0 if success else 0.0,
        "tasksuccess": success,
        "taskfailure": failure,
        "done": world.done,
        "steps": world.steps,
        "remaining_shared_steps": remaining,
        "agent_location": room,
        "completed_dishes": completed,
        "total_dishes": len(c.dish_ids),
    }
    return "\n".join(lines), infos
