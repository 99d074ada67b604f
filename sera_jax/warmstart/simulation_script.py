"""The oracles as a simulated device's script (``engine.backend: simulated``): each environment's warm-start
oracle plays every agent, rubric and score call, tokenised with the run's tokenizer, so real environments,
sandboxes, delegations, rubrics and scores run behind the simulated device.

The oracles' settings are the warm start's (``warmstart.delegate_prob``, ``fail_prob``, ``seed``, …): its sabotaged
children give the rubric stage's fork groups successes and failures to rank, as a sampled policy's would.
"""

from __future__ import annotations

from typing import Any

from envs_py.textcraft import recipe_book
from sera_jax.agents.scripted import script_emission
from sera_jax.assembly.tasks import load_env_tasks
from sera_jax.warmstart.oracle import TextCraftOracle
from sera_jax.warmstart.textworld_oracle import TextWorldOracle


def textcraft_script(cfg: Any, tokenizer: Any):
    """Returns the TextCraft oracle's emissions for a run of ``cfg`` (its tasks' recipe book)."""
    ws = cfg.warmstart
    tasks, _ = load_env_tasks(cfg)
    world = tasks[0].payload.get("world") or {}
    book = recipe_book(int(world.get("seed", 42)), int(world.get("items_per_domain_tier", 25)))
    oracle = TextCraftOracle(book, tokenizer, max_depth=cfg.env.max_depth, delegate_prob=ws.delegate_prob,
                             fail_prob=ws.fail_prob, exhaust_share=ws.exhaust_share,
                             rubric_target_prob=ws.rubric_target_prob, rubric_miss=ws.rubric_miss, seed=ws.seed)
    return script_emission(tokenizer, oracle)


def textworld_script(cfg: Any, tokenizer: Any):
    """Returns the TextWorld-Sync oracle's emissions for a run of ``cfg``."""
    ws = cfg.warmstart
    oracle = TextWorldOracle(tokenizer, delegate_prob=ws.delegate_prob, fail_prob=ws.fail_prob, seed=ws.seed,
                             child_rule=ws.child_rule)
    return script_emission(tokenizer, oracle)
