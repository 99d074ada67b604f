"""TextWorld-Sync system prompt (docs/design/textworld.md §11); the user-turn texts come from envs_py.textworld_sync.messages.

Our own wording, with the reference prompt's content: who the agent is and its depth; commands come from the
Valid Actions list; own history and location but a shared world and shared resources; the shared inventory is only
seen through the inventory look-up; no invented state; goals of sub-agents may be more detailed than the parent's;
a budget-aware collaboration paragraph; interaction tips; a delegation-strategy section with both ``<delegate>``
forms and the depth facts while the agent may still delegate; one block per reply; scored by the environment.
"""

from __future__ import annotations


def system_prompt(agent_id: str, depth: int, max_depth: int, can_delegate: bool, subagents_enabled: bool = True) -> str:
    """Returns the system message of agent ``agent_id`` at ``depth`` (delegation section iff ``can_delegate``)."""
    parts = [
        f"You are Agent {agent_id}, working at delegation depth {depth} in a shared text-based cooking world.",
        "Every command you send must be one of the Valid Actions listed for you at that moment. You keep your own "
        "history and your own location, but the world, its objects and its resources are shared with every other "
        "Agent working on the same task. The shared inventory is not shown to you automatically: use the inventory "
        "action when you need it. Never assume state you have not observed. A sub-agent's goal can be more detailed "
        "than its parent's task.",
    ]
    if subagents_enabled:
        parts.append(
            "Budget and collaboration: your turns are limited. Think about whether the task splits into independent "
            "subgoals that others could pursue. A sub-agent has its own budget, which does not consume yours.")
    parts.append(
        "Tips: read the observation and the Valid Actions carefully, keep track of what each step requires before "
        "it can be done, and check before you conclude that something is unavailable.")
    if can_delegate:
        parts.append(
            "Delegation strategy:\n"
            "- Delegate coherent, independent subtasks; sub-agents may delegate further.\n"
            "- Launch one group of sub-agents at a time and keep enough budget for the final assembly yourself.\n"
            "- Do not give two sub-agents tasks that compete for the same unique object or the same irreversible "
            "change.\n"
            "- Write concrete goals: name the objects, the preparation and where results should end up.\n"
            'One sub-agent: <delegate>{"goal": "...", "max_steps": N}</delegate>\n'
            'Several in parallel: <delegate>{"delegations": [{"goal": "..."}, {"goal": "...", "max_steps": N}]}'
            "</delegate>\n"
            f"Maximum delegation depth: {max_depth}. Your depth: {depth}.")
    parts.append("Return exactly one block per reply. Success is judged by the environment itself, not by a language "
                 "model.")
    return "\n\n".join(parts)


# The compact style (``prompt_style: compact``; the tiny CPU default, ``configs/tiny_textworld.yaml``): the same
# world, observations, valid actions and reply protocol in a few lines, for models too small to use the paper's
# instructions. Departures, on purpose: no agent id (siblings' and fork branches' prompts then share their prefix in
# the engine's cache), delegation offered only while the agent may still delegate (a tiny model is not told its
# depth), and no budget lines or score flags per turn. The task comes last in the first message: the root's
# delegation copies its dishes from close by.
COMPACT_SYSTEM = "You are an agent in a shared cooking world. Reply with one block: <action>a valid action</action>"
COMPACT_DELEGATE = ', <delegate>{"delegations": [{"goal": "..."}]}</delegate> to start sub-agents on parts of it'
COMPACT_FINISH = ", or <finish>message</finish> when your task is done."
VALID_HEADER = "# Valid Actions"


def compact_system_prompt(can_delegate: bool) -> str:
    """Returns the compact system message (the delegate block offered iff ``can_delegate``)."""
    return COMPACT_SYSTEM + (COMPACT_DELEGATE if can_delegate else "") + COMPACT_FINISH


def compact_task_message(task_text: str, observation: str, valid_actions: list[str]) -> str:
    """Returns the compact first user message: the observation, the valid actions (one a line), then the task."""
    return f"# Observation\n{observation}\n\n{VALID_HEADER}\n" + "\n".join(valid_actions) + f"\n\n# Task\n{task_text}"


def compact_feedback(observation: str, valid_actions: list[str]) -> str:
    """Returns the compact user message after a turn: that turn's observation and the valid actions now."""
    return f"{observation}\n\n{VALID_HEADER}\n" + "\n".join(valid_actions)
