"""TextCraft-Synth's registration: what the runtime, credit assignment, config checks and warm start need to know
about it (docs/design/textcraft.md). Worlds and their agents' sandboxes live in env worker processes; every agent is
labelled by the world's programmatic check."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from sera_jax.agents.environments.registry import BuiltinTokenizer, Environment, register

NAME = "textcraft"
TASK_SETS = ("train", "val", "generated")
GENERATED_TRAIN_TASKS = 4000
CHILD_TOOLS_TEXT = "get_info, view_inventory, craft, finish, launch_subagent"


def runtime_defaults(evaluation: bool) -> dict[str, Any]:
    """Returns the RuntimeSettings fields of TextCraft's reference caps (evaluation: the larger prompt cap)."""
    return dict(max_prompt_tokens=9728 if evaluation else 9600, max_context=10240, max_new_tokens=512,
                stop_strings=("</python>",))


def load_tasks(task_set: str) -> tuple[list[Any], list[str]]:
    """Returns (tasks, data files) of ``task_set``: "train" | "val", a task file, or "generated" (the generator's
    train split: train items only, disjoint from every val item, by the upstream rules)."""
    import envs_py.textcraft as textcraft_env  # the recipe book loads on first use, not at registration

    if task_set == "generated":
        return textcraft_env.generate_tasks("train", n_train=GENERATED_TRAIN_TASKS), []
    return textcraft_env.load_tasks(task_set), [task_set] if Path(task_set).is_file() else []


def task_set_error(task_set: str, check_paths: bool) -> str | None:
    """Returns what is wrong with ``task_set`` (a named set or a .json/.jsonl task file), or None."""
    if task_set not in TASK_SETS and not task_set.endswith((".json", ".jsonl", ".json.gz", ".jsonl.gz")):
        return f"expected one of {sorted(TASK_SETS)} or a .json/.jsonl path, got {task_set!r}"
    if check_paths and task_set not in TASK_SETS and not Path(task_set).is_file():
        return f"no task file {task_set}"
    return None


TEXTCRAFT = register(Environment(
    name=NAME,
    open_world="sera_jax.agents.textcraft:open_world",
    root_episode="sera_jax.agents.textcraft:root_episode",
    needs_pool=True,
    worker_factory="sera_jax.agents.envs:RuntimeTextCraftSession.from_task",
    runtime_defaults=runtime_defaults,
    child_tools_text=CHILD_TOOLS_TEXT,
    observation_after_launch=False,
    final_state="child_inventory",
    compact_score_request="sera_jax.agents.rubric:compact_score_request",
    labels="programmatic",
    launch_spans="sera_jax.rl.launch_spans:launch_statement_spans",
    invalid_launch_datums=True,
    filter_errors=True,
    filter_zero_variance=True,
    load_tasks=load_tasks,
    task_set_error=task_set_error,
    options=frozenset({"order_discrimination"}),
    warmstart_oracle="sera_jax.warmstart.demos:collect_demos",
    simulation_script="sera_jax.warmstart.simulation_script:textcraft_script",
    demo_version="sera_jax.warmstart.demos:DEMO_VERSION",
    shipped_warmstart="tiny_warmstart",
    tokenizer=BuiltinTokenizer("textcraft", "textcraft_tiny.model", "sera_jax.warmstart.tokenizer"),
))
