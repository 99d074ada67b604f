"""Side calls (rubric writing, scoring) fit the serving engine: with ``RubricConfig.max_context`` the prompt budget
shrinks to context − completion cap, so a long child trajectory is cut by the §1.3 rule instead of failing the call
("prompt of N tokens leaves no room in the engine's context") — which on the 1,024-token tiny engine made most
failing children's scores invalid and their trajectories dropped."""

from __future__ import annotations

import asyncio
import types

import jax
import pytest

from sera_jax.agents.records import Node, Tree, Turn
from sera_jax.agents.rubric_calls import RubricConfig, score_node
from sera_jax.agents.scripted import ScriptedGenerator
from sera_jax.agents.settings import RuntimeSettings
from tests.agents.rubric_scripts import score_text

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
