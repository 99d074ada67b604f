"""TextCraft-Synth: recipes, official and generated tasks, the tool world, checker, solver and CodeAct glue.

Public names: ``load_tasks("val" | "train" | path)`` and ``generate_tasks(...)`` return lists of
:class:`envs_py.core.Task` (``.task_id``, ``.difficulty``, ``.goal``, ``.payload``); :class:`TextCraftWorld` is
one tree's world; :class:`TextCraftSession` adds sandboxed cells (the object env workers host); ``solve`` and
``gold_plan`` produce craft plans; ``DEFAULT_MAX_STEPS`` (20) is the per-agent cell budget, a runtime setting.
"""

from envs_py.textcraft.cells import is_stuck, observation_text, parse_reply, subagent_result_text
from envs_py.textcraft.generator import generate_tasks
from envs_py.textcraft.recipes import RecipeBook, official_recipes, recipe_book
from envs_py.textcraft.solver import gold_plan, simulate, solve
from envs_py.textcraft.tasks import DEFAULT_MAX_STEPS, load_tasks, save_tasks
from envs_py.textcraft.world import TextCraftWorld


def __getattr__(name):
    # The session pulls in the sandbox host; import it only when asked for.
    if name == "TextCraftSession":
        from envs_py.textcraft.session import TextCraftSession

        return TextCraftSession
    raise AttributeError(name)


__all__ = ["DEFAULT_MAX_STEPS", "RecipeBook", "TextCraftSession", "TextCraftWorld", "generate_tasks", "gold_plan",
           "is_stuck", "load_tasks", "observation_text", "official_recipes", "parse_reply", "recipe_book",
           "save_tasks", "simulate", "solve", "subagent_result_text"]
