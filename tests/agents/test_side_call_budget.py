"""Side calls (rubric writing, scoring) fit the serving engine: with ``RubricConfig.max_context`` the prompt budget
shrinks to context − completion cap, so a long child trajectory is cut by the §1.3 rule instead of failing the call
("prompt of N tokens leaves no room in the engine's context") — which on the 1,024-token tiny engine made most
failing children's scores invalid and their trajectories dropped.

The budget itself is the run's agent prompt cap + agent completion cap − the call's own cap (docs/design/recipes.md §1c):
TextCraft 9,088; TextWorld 12,288 for rubric writing and execution-stage scoring, 12,800 for 512-token scoring."""

from __future__ import annotations

import asyncio
import types
from pathlib import Path

import jax
import pytest

from sera_jax.agents.judge import ProgrammaticJudge
from sera_jax.agents.launchers.factory import make_launcher_factory
from sera_jax.agents.records import Node, Tree, Turn
from sera_jax.agents.rubric_calls import RubricConfig, run_limits, score_node
from sera_jax.agents.scripted import ScriptedGenerator
from sera_jax.agents.settings import RuntimeSettings
from sera_jax.assembly.settings import runtime_settings
from sera_jax.config import load_config
from sera_jax.rl.stages import method_config
from tests.agents.rubric_scripts import score_text

ROOT = Path(__file__).resolve().parents[2]
RUBRIC = {"rubric_items": [{"name": "crafted", "weight": 1.0, "description": "the target is crafted"},
                           {"name": "finished", "weight": 0.0, "description": "calls finish"}],
          "success_gate": "1x o3_i1 crafted", "failure_conditions": ["a craft fails"]}


class ContextBound(ScriptedGenerator):
    """A scripted generator that refuses, like the engine, a prompt that leaves no room for the completion cap."""

    def __init__(self, tok, context):
        super().__init__(tok, lambda info, ids: score_text(0.75))
        self.context, self.prompts = context, []

    async def generate(self, prompt_ids, params, key=None):
        if len(prompt_ids) + params.max_new_tokens > self.context:
            raise ValueError(f"prompt of {len(prompt_ids)} tokens leaves no room in the engine's context of "
                             f"{self.context} tokens")
        self.prompts.append(list(prompt_ids))
        return await super().generate(prompt_ids, params, key)


def _long_child():
    turns = [Turn(index=i, prompt_ids=[], completion_ids=[], logprobs=[], policy_version=0,
                  code=f"print(craft({{'raw_o5': {i}}}, ('o3_i1', 4)))  # attempt {i} " + "x" * 60,
                  output=f"Could not craft o3_i1: step {i} " + "y" * 60) for i in range(12)]
    return Node(id="root/subagent-1-0", goal="Craft the following items: 1x o3_i1", depth=1, parent_id="root",
                turns=turns, finish_message="gave up")


def _score(tok, cfg, context):
    gen = ContextBound(tok, context)
    child = _long_child()
    run = types.SimpleNamespace(generator=gen, tokenizer=tok, root_key=jax.random.key(0),
                                tree=Tree(id="t", task_id="x", root_id="root", nodes={"root/subagent-1-0": child}),
                                settings=RuntimeSettings.for_env("textcraft"))
    call, score, err = asyncio.run(score_node(run, RUBRIC, child, {}, cfg.scoring_spec(), "score:root/subagent-1-0"))
    return gen, call, score, err


def test_scoring_prompt_is_cut_to_the_engine_context(tok):
    context, cap = 512, 32
    gen, call, score, err = _score(tok, RubricConfig(max_scoring_tokens=cap), context)
    assert score is None and "leaves no room" in err  # the fixed 9,088-token budget: the call fails
    gen, call, score, err = _score(tok, RubricConfig(max_scoring_tokens=cap, max_context=context), context)
    assert err == "" and call.turn is not None
    assert len(gen.prompts) == 1 and len(gen.prompts[0]) <= context - cap
    assert call.turn.misc["prompt_full_len"] > context  # the request was longer: it was cut, not refused


def test_budget_shrinks_only_when_the_engine_is_smaller():
    paper = RubricConfig(max_rubric_tokens=1024, max_context=10240)
    assert paper.rubric_spec().max_prompt_tokens == 9088  # the spec's budget fits the paper's engine unchanged
    tiny = RubricConfig(max_rubric_tokens=128, max_scoring_tokens=48, max_context=1024)
    assert tiny.rubric_spec().max_prompt_tokens == 896 and tiny.scoring_spec().max_prompt_tokens == 976
    assert tiny.scoring_spec().max_context == 1024
    with pytest.raises(ValueError, match="no prompt room"):
        RubricConfig(max_scoring_tokens=64, max_context=64).scoring_spec()


def test_budget_is_agent_caps_minus_the_call_cap(tok):
    """The derived cap reaches the call: agent caps 300 + 100 and a 64-token score → prompts of at most 336 tokens."""
    cfg = RubricConfig(max_scoring_tokens=64, agent_prompt_tokens=300, agent_completion_tokens=100)
    assert cfg.scoring_spec().max_prompt_tokens == 336 and cfg.prompt_budget(512) == 1  # never below one token
    gen, call, score, err = _score(tok, cfg, 4096)
    assert err == "" and len(gen.prompts[0]) <= 336 < call.turn.misc["prompt_full_len"]


# The paper recipes (configs/paper, docs/design/recipes.md §1a/§1b): rubric and execution-stage score calls 1,024 tokens;
# rubric-generation-stage score calls 1,024 (TextCraft's launchers) or 512 (TextWorld).
PAPER = [("textcraft", 9088, 9088, 9088), ("textworld", 12288, 12288, 12800)]


@pytest.mark.parametrize("env, rubric, exec_score, rt_score", PAPER, ids=[p[0] for p in PAPER])
def test_paper_side_call_budgets(env, rubric, exec_score, rt_score):
    """The launchers of a paper run, made as training makes them (the run's settings and method), cap their side
    calls' prompts at agent prompt cap + agent completion cap − the call's cap."""
    cfg = load_config(ROOT / "configs" / "paper" / f"{env}_sera.yaml")
    method, settings, task = cfg.method_config(), runtime_settings(cfg), types.SimpleNamespace(task_id="t")
    exe = make_launcher_factory("execution", method, cfg.env.name, settings=settings)(task, 0).config
    col = make_launcher_factory("rubric_generation", method, cfg.env.name, judge=ProgrammaticJudge(),
                                settings=settings)(task, 0).config
    assert exe.rubric_spec().max_prompt_tokens == col.rubric_spec().max_prompt_tokens == rubric
    assert exe.scoring_spec().max_prompt_tokens == exec_score and col.scoring_spec().max_prompt_tokens == rt_score
    assert col.max_scoring_tokens == method.rubric_stage_max_scoring_tokens == (1024 if env == "textcraft" else 512)
    assert exe.scoring_spec().max_context == settings.max_context  # the context clamp stays (it does not bind here)
    assert RubricConfig(**run_limits(settings)).rubric_spec().max_prompt_tokens == rubric


def test_test_time_selection_and_the_default_caps():
    settings = RuntimeSettings.for_env("textworld_sync", evaluation=True)
    task = types.SimpleNamespace(task_id="t")
    sel = make_launcher_factory("evaluation", None, "textworld_sync", selection={"n": 2}, settings=settings)(task, 0)
    assert (sel.rubric_spec.max_prompt_tokens, sel.scoring_spec.max_prompt_tokens) == (12288, 12800)
    # Without the run's settings: TextCraft's training caps in every environment (the behaviour before the caps
    # followed the run), and no context cut.
    exe = make_launcher_factory("execution", method_config("SERA"), "textworld_sync")(task, 0).config
    assert exe.rubric_spec().max_prompt_tokens == 9088 and exe.rubric_spec().max_context is None
