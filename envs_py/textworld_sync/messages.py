"""Fixed-format texts the agent runtime shows an agent in TextWorld-Sync (docs/design/textworld.md §10.3, §10.4, §11).

The prompt itself is built by the agent runtime (sera_jax/agents/textworld.py); these helpers give it the exact
information content of each turn's observation so every runner formats them identically.
"""

from __future__ import annotations

from typing import Any, Iterable, Mapping, Sequence

MAX_DEPTH = 3
FINAL_OBSERVATION_CHARS = 1200


def child_agent_id(parent_id: str, step_index: int, child_index: int) -> str:
    """Returns a sub-agent's id: '<parent_id>/subagent-<step_index>-<child_index>'."""
    return f"{parent_id}/subagent-{step_index}-{child_index}"


def inventory_lookup_text(inventory: str, observation: str) -> str:
    """Returns the turn observation of a free inventory look-up (no world step)."""
    return (
        "[Inventory Lookup]\nCurrent shared inventory (visible to all Agents):\n"
        f"{inventory}\n\nCurrent environment observation:\n{observation}"
    )


def depth_rejection_text(depth: int, observation: str, max_depth: int = MAX_DEPTH) -> str:
    """Returns the turn observation of a delegation refused at the depth limit (costs a turn, no world step)."""
    return (
        f"SubAgent delegation rejected: current depth {depth} reached the maximum allowed depth {max_depth}.\n"
        f"{observation}"
    )


def invalid_reply_text(error: str, observation: str) -> str:
    """Returns the turn observation after a malformed reply: the parser's error, then the current observation."""
    return f"{error}\n\n{observation}"


def subagent_results_text(children: Iterable[Mapping[str, Any]], observation: str) -> str:
    """Returns the parent's turn observation after its sub-agents return (docs/design/textworld.md §10.3).

    Each child record needs agent_id, returned_to_parent, environment_success, steps, max_steps and may carry
    remaining_steps (default max_steps - steps), finish_message and final_observation."""
    lines = ["[SubAgent Results]"]
    for child in children:
        steps = int(child.get("steps", 0))
        max_steps = int(child.get("max_steps", 0))
        remaining = int(child.get("remaining_steps", max(max_steps - steps, 0)))
        message = child.get("finish_message") or "(no explicit finish message)"
        final = str(child.get("final_observation", ""))[:FINAL_OBSERVATION_CHARS]
        lines.append(
            f"- Agent {child.get('agent_id')}: returned={bool(child.get('returned_to_parent', False))}, "
            f"environment_success={bool(child.get('environment_success', False))}, steps={steps}"
        )
        lines.append(
            f"  Budget used by subagent: {steps}/{max_steps} steps. "
            f"Total remaining budget for this SubAgent task is {remaining} steps."
        )
        lines.append(f"  result: {message}")
        lines.append(f"  final observation: {final}")
    lines += ["", "[Current Environment Observation]", observation]
    return "\n".join(lines)


def task_message_text(task_text: str, budget: int, observation: str, valid_actions: Sequence[str],
                      subagents_enabled: bool = True) -> str:
    """Returns the first user message of an agent (docs/design/textworld.md §11): the task (root) or goal (sub-agent), its budget,
    the observation, the valid actions, the action space (delegate / finish shown whenever sub-agents are enabled,
    even at the depth limit) and the request for a first action."""
    space = [
        "1. <action>COMMAND</action> - one command from the Valid Actions list (costs one shared step).",
        "2. <action>inventory</action> - look up the shared inventory (free: no shared step).",
    ]
    if subagents_enabled:
        space += [
            '3. <delegate>{"goal": "...", "max_steps": N}</delegate> or '
            '<delegate>{"delegations": [{"goal": "..."}, {"goal": "...", "max_steps": N}]}</delegate>'
            " - launch sub-agents that share this world.",
            "4. <finish>MESSAGE</finish> - stop and return MESSAGE to your parent Agent.",
        ]
    parts = [
        "# Task", task_text, "",
        f"Budget: You have a total budget of {budget} steps to complete this task.", "",
        "# Initial Observation", observation, "",
        "# Valid Actions", *[f"- {a}" for a in valid_actions], "",
        "# Action Space", *space, "",
    ]
    if subagents_enabled:
        parts += ["# Delegation", "Follow the delegation strategy in the system message.", ""]
    parts.append("Now provide the first action or delegation." if subagents_enabled
                 else "Now provide the first action.")
    return "\n".join(parts)


def turn_feedback_text(step_index: int, observation: str, budget: int, infos: Mapping[str, Any]) -> str:
    """Returns the user message after an agent's turn (docs/design/textworld.md §11): the turn's observation, the agent's budget,
    the valid actions at that time and the score / success / failure / done flags."""
    used = min(step_index + 1, budget)
    actions: Sequence[str] = infos.get("validActions") or []
    return "\n".join([
        f"[Step {step_index} Observation]",
        observation,
        "",
        f"Budget used by current Agent: {used}/{budget} steps.",
        f"Current Agent remaining budget: {budget - used} steps.",
        "",
        "Valid Actions:",
        *[f"- {a}" for a in actions],
        "",
        f"Score: {infos.get('score', 0.0)}",
        f"Task Success: {infos.get('tasksuccess', False)}",
        f"Task Failure: {infos.get('taskfailure', False)}",
        f"Done: {infos.get('done', False)}",
        "",
        "SubAgent results, if any, appear in the observation above.",
        "Provide your next action or delegation.",
    ])
