"""tools/research/textworld_failures.py on trees the oracle plays through the real runtime under the default's 10
own turns: delegating trees are solved (though the two children, acting on one world from the same observation, collide), a
root that never delegates fails as ``root acted alone``, a root whose turns after its children returned are refused
is ``stuck``, and a reply's probability is the same whichever way the tool tokenises it."""

from __future__ import annotations

import asyncio
import dataclasses
import importlib.util
from pathlib import Path

import pytest

from sera_jax.agents.launchers.factory import make_launcher_factory
from sera_jax.agents.runtime import run_trees
from sera_jax.assembly.settings import runtime_settings
from sera_jax.assembly.tasks import load_env_tasks
from sera_jax.assembly.tokenizer import resolve_tokenizer
from sera_jax.config import load_config
from sera_jax.warmstart.demos import RecordingGenerator
from sera_jax.warmstart.textworld_demos import ENV
from sera_jax.warmstart.textworld_oracle import TextWorldOracle

_spec = importlib.util.spec_from_file_location(
    "textworld_failures", Path(__file__).resolve().parents[1] / "tools" / "research" / "textworld_failures.py")
tf = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(tf)

CONFIG = "configs/tiny_textworld.yaml"


@pytest.fixture(scope="module")
def cfg():
    return load_config([CONFIG])


@pytest.fixture(scope="module")
def tok(cfg):
    return resolve_tokenizer(cfg.model.tokenizer, None)[0]


def _play(cfg, tok, delegate_prob):
    tasks = load_env_tasks(cfg)[0][::50][:5]
    gen = RecordingGenerator(tok, TextWorldOracle(tok, delegate_prob=delegate_prob, fail_prob=0.0))
    settings = runtime_settings(cfg)

    async def main():
        factory = make_launcher_factory("execution", cfg.method_config(), ENV, settings=settings)
        return await factory.finalize(await run_trees(tasks, ENV, gen, tok, settings, max_concurrent=8,
                                                      launcher_factory=factory))

    assert cfg.env.max_steps == 10
    return asyncio.run(main())


@pytest.fixture(scope="module")
def delegating(cfg, tok):
    return _play(cfg, tok, 1.0)


def test_delegating_oracle_trees_are_solved_though_their_children_collide(delegating):
    s = tf.summarise(delegating)
    assert s["solved"] == s["trees"] == 5 and sum(s["failures"].values()) == 0 and s["stuck_turns"] == []
    assert 0 < s["child_invalid"] < s["child_turns"]
    first = s["first_action"]
    assert sum(first.values()) == 2 * s["trees"]  # one first action per child, two children per tree
    assert first["own, rejected"] + first["sibling, rejected"] > 0  # one child's first action is refused


def test_a_root_that_acts_alone_fails_under_ten_turns(cfg, tok):
    s = tf.summarise(_play(cfg, tok, 0.0))
    assert s["solved"] == 0 and s["failures"] == {tf.MODES[0]: s["trees"], tf.MODES[1]: 0, tf.MODES[2]: 0}
    assert s["child_turns"] == 0


def test_a_root_refused_after_its_children_returned_is_stuck(delegating):
    tree = next(t for t in delegating
                if len(t.nodes[t.root_id].turns) > t.delegations[-1].fork_step + 2)
    root = tree.nodes[tree.root_id]
    start = tree.delegations[-1].fork_step + 1
    turns = root.turns[:start] + [dataclasses.replace(t, error="Action is not valid.") for t in root.turns[start:]]
    failed = dataclasses.replace(root, reward=dataclasses.replace(root.reward, environment=0.0), turns=turns)
    stuck = dataclasses.replace(tree, nodes={**tree.nodes, root.id: failed})
    view = tf.tree_view(stuck)
    assert view["mode"] == tf.MODES[1] and view["stuck_turn"] is turns[start]
    half = turns[:start] + turns[start:start + 1] + root.turns[start + 1:]  # one refused turn of several: other
    other = dataclasses.replace(tree, nodes={**tree.nodes, root.id: dataclasses.replace(root, reward=dataclasses.replace(root.reward, environment=0.0),
                                                                                         turns=half)})
    assert tf.tree_view(other)["mode"] == tf.MODES[2]


def test_the_rule_reply_is_the_oracles_and_scores_like_the_sampled_one(cfg, tok, delegating):
    from sera_jax.evaluation.protocol import load_policy

    tree = next(t for t in delegating
                if len(t.nodes[t.root_id].turns) > t.delegations[-1].fork_step + 1)
    turn = tree.nodes[tree.root_id].turns[tree.delegations[-1].fork_step + 1]
    assert tf.rule_reply(turn, tok.decode) == turn.code  # the oracle's root carries on by the rule
    (sampled, rule), = tf.reply_probabilities(load_policy(cfg), [turn])
    assert 0.0 < rule <= 1.0 and rule == pytest.approx(sampled, rel=1e-5)
