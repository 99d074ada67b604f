"""The rubric probe on real TextCraft trees played by the oracle: the set holds only mixed fork groups and is shared
as a file; a perfect evaluator scores accuracy 1, one whose rubrics are vague half the time scores lower; the numbers
follow the spec's ranking definitions; collection fails loudly when the tasks cannot supply the groups."""

from __future__ import annotations

import asyncio
import dataclasses

import pytest

from envs_py.textcraft import recipe_book
from sera_jax.agents.records import Branch, ForkGroup
from sera_jax.agents.scripted import ScriptedGenerator
from sera_jax.assembly.tokenizer import resolve_tokenizer
from sera_jax.config import load_config
from sera_jax.evaluation.rubric_probe import (
    collect_probe_set,
    load_probe_set,
    mixed_group,
    probe_metrics,
    score_probe,
)
from sera_jax.warmstart.oracle import TextCraftOracle

CONFIG = "configs/tiny_cpu.yaml"


@pytest.fixture(scope="module")
def cfg():
    # The oracle delegates every ingredient; 4 branches at one fork point per tree; 16 held-out Easy tasks at most.
    return load_config([CONFIG], ["env.num_workers=1", "eval.num_tasks=16", "eval.concurrency=4",
                                  "method.max_counterfactual_envs_per_rollout=4"])


@pytest.fixture(scope="module")
def tok(cfg, tmp_path_factory):
    return resolve_tokenizer(cfg.model.tokenizer, None)[0]


def _oracle(tok, cfg, knows=None, **kw):
    """The oracle as a generator; ``knows``: another oracle whose sabotaged children this one's scores recognise (an
    oracle scores a child by whether it sabotaged it)."""
    oracle = TextCraftOracle(recipe_book(), tok, max_depth=cfg.env.max_depth, delegate_prob=1.0, fail_prob=0.5, **kw)
    if knows is not None:
        oracle.sabotaged = knows.sabotaged
    return ScriptedGenerator(tok, oracle)


def _group(scores, labels, rubric=True):
    g = ForkGroup(id="g", parent_id="root", fork_step=1, child_depth=1, num_branches=len(labels),
                  rubric={"x": 1} if rubric else None)
    g.branches = [Branch(branch_index=b, trajectory_id=f"c#b{b}", depth=1, reward=0.0, success=y, score=s)
                  for b, (s, y) in enumerate(zip(scores, labels))]
    return g


def test_probe_metrics_follow_the_ranking_definitions():
    t, f = True, False
    spec = _group([0.9, 0.5, 0, 0.4, 0, 0, 0, 0], [t, t, f, f, f, f, f, f])   # docs/design/algorithm.md §5.2's example
    tie = _group([0.5] * 4, [t, f, f, t])                                       # a vague rubric: all ties
    invalid = _group([None] * 4, [t, f, f, t], rubric=False)
    one_score = _group([0.9, None, None, None], [t, f, f, f])                  # < 2 valid scores: not ranked
    m = probe_metrics([spec, tie, invalid, one_score], samples=2)
    assert m["groups"] == 2 and m["samples"] == 2
    assert m["rubric_valid"] == 0.75 and m["ranked"] == 0.5
    assert m["ranking_accuracy"] == pytest.approx((1.0 + 0.0) / 2)
    assert m["ranking_auc"] == pytest.approx((1.0 + 0.5) / 2)
    assert m["hinge_reward"] == pytest.approx((-0.1 / 12 - 0.2) / 2, abs=1e-6)
    assert m["ranking_accuracy_all"] == pytest.approx(1.0 / 4)
    assert mixed_group(spec) and not mixed_group(_group([0.1] * 3, [t, t, t]))
    short = _group([0.1, 0.2], [t, f])
    short.num_branches = 4  # two of four branches ran: not a whole group
    assert not mixed_group(short)


def test_collect_then_score_a_perfect_and_a_half_vague_evaluator(cfg, tok, tmp_path):
    path = tmp_path / "probe.jsonl"
    player = _oracle(tok, cfg)
    trees = asyncio.run(collect_probe_set(cfg, player, tok, path, groups=3, seed=1, log=lambda _: None))
    again = load_probe_set(path)
    assert [t.id for t in again] == [t.id for t in trees]
    groups = [g for t in again for g in t.fork_groups]
    assert len(groups) == 3 and all(mixed_group(g) and g.rubric is None for g in groups)
    assert all(set(t.misc["fork_group_inputs"]) == {g.id for g in t.fork_groups} for t in again)

    # The oracle's rubrics name the goal and its scores are the children's true outcomes: a perfect ranking.
    perfect = asyncio.run(score_probe(cfg, again, player, tok, samples=2))
    assert perfect["groups"] == 3 and perfect["rubric_valid"] == 1.0 and perfect["ranked"] == 1.0
    assert perfect["ranking_accuracy"] == 1.0 and perfect["ranking_auc"] == 1.0 and perfect["hinge_reward"] == 0.0
    # Half its rubrics name no item ("its goal"): every child scores 0.5 under those, ties, accuracy 0 there.
    def half_vague(seed):
        return _oracle(tok, cfg, knows=player.script, rubric_target_prob=0.5, rubric_miss="generic", seed=seed)

    for seed in range(8):  # an oracle seed whose draws miss some of the 3 groups' rubrics and name others
        gen = half_vague(seed)
        vague = asyncio.run(score_probe(cfg, again, gen, tok, samples=2))
        if gen.script.rubrics["generic"] and gen.script.rubrics["target"]:
            break
    drawn = gen.script.rubrics
    assert drawn["generic"] and drawn["target"] and drawn["generic"] + drawn["target"] == 3 * 2
    assert vague["rubric_valid"] == 1.0 and vague["ranked"] == 1.0
    share = drawn["target"] / 6
    assert vague["ranking_accuracy"] == pytest.approx(share)              # a named goal ranks perfectly, "its goal"
    assert vague["ranking_auc"] == pytest.approx(share + 0.5 * (1 - share))  # ties everything
    assert vague["hinge_reward"] == pytest.approx(-0.2 * (1 - share), abs=1e-6)
    # The same policy and keys give the same numbers (the probe is a measurement, not a new sample each time).
    assert asyncio.run(score_probe(cfg, again, half_vague(seed), tok, samples=2)) == vague

def test_collection_that_finds_too_few_groups_says_so(cfg, tok, tmp_path):
    never = ScriptedGenerator(tok, TextCraftOracle(recipe_book(), tok, max_depth=cfg.env.max_depth,
                                                   delegate_prob=0.0, fail_prob=0.0))
    with pytest.raises(ValueError, match="gave 0 mixed fork groups"):
        asyncio.run(collect_probe_set(cfg, never, tok, tmp_path / "p.jsonl", groups=2, max_tasks=3,
                                      log=lambda _: None))
    assert not (tmp_path / "p.jsonl").exists()
    with pytest.raises(ValueError, match="TextCraft"):
        tw = dataclasses.replace(cfg, env=dataclasses.replace(cfg.env, name="textworld_sync"))
        asyncio.run(collect_probe_set(tw, never, tok, tmp_path / "p.jsonl", groups=2))
