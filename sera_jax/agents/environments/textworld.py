"""TextWorld-Sync's registration (docs/design/textworld.md): one shared world per tree, in an env worker when the
runtime has a pool, else in-process; sub-agents are labelled by a judge (the world check means "the whole shared
task is solved"); world rules, fork groups and the demo oracle's child rule are its own settings."""

from __future__ import annotations

from typing import Any

from sera_jax.agents.environments.registry import BuiltinTokenizer, Environment, register

NAME = "textworld_sync"
CHILD_TOOLS_TEXT = "TextWorld environment actions, inventory lookup, finish, and launch_subagent"


def runtime_defaults(evaluation: bool) -> dict[str, Any]:
    """Returns the RuntimeSettings fields of TextWorld-Sync's reference caps (the same for evaluation)."""
    return dict(max_prompt_tokens=10240, max_context=13312, max_new_tokens=3072, stop_strings=())


TEXTWORLD = register(Environment(
    name=NAME,
    open_world="sera_jax.agents.textworld:open_world",
    root_episode="sera_jax.agents.textworld:root_episode",
    needs_pool=False,
    worker_factory="envs_py.textworld_sync.world:make_world",
    runtime_defaults=runtime_defaults,
    child_tools_text=CHILD_TOOLS_TEXT,
    observation_after_launch=True,
    final_state="world",
    compact_score_request="sera_jax.agents.rubric:compact_textworld_score_request",
    labels="judge",
    launch_spans="sera_jax.rl.launch_spans:delegate_block_spans",
    invalid_launch_datums=False,
    filter_errors=False,
    filter_zero_variance=False,
    load_tasks="envs_py.textworld_sync.task_sets:load_task_set",
    task_set_error="envs_py.textworld_sync.task_sets:task_set_error",
    options=frozenset({"env.rules", "warmstart.child_rule", "warmstart.copy_task_set"}),
    warmstart_oracle="sera_jax.warmstart.textworld_demos:collect_textworld_demos",
    simulation_script="sera_jax.warmstart.simulation_script:textworld_script",
    demo_version="sera_jax.warmstart.textworld_demos:TEXTWORLD_DEMO_VERSION",
    warmstart_recipe="sera_jax.warmstart.textworld_demos:recipe_play",
    shipped_warmstart="tiny_textworld_warmstart",
    tokenizer=BuiltinTokenizer("textworld", "textworld_tiny.model", "sera_jax.warmstart.textworld_tokenizer"),
))
