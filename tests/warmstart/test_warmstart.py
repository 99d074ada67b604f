"""The oracle warm start: the oracle solves tasks through the real runtime (sandboxed cells, delegation, rubric and
score calls), sabotaged children fail and are scored 0, demo datums train exactly the completion tokens of the
kept agents and calls, and a short SFT run lowers the NLL and leaves a checkpoint ``model.init_from`` loads."""

import asyncio
import dataclasses
import json

import jax
import numpy as np
import pytest

from envs_py.textcraft import load_tasks, recipe_book
from sera_jax.agents.launchers.factory import make_launcher_factory
from sera_jax.agents.rubric import parse_rubric, parse_score
from sera_jax.agents.runtime import run_trees
from sera_jax.assembly.settings import runtime_settings
from sera_jax.assembly.tokenizer import resolve_tokenizer
from sera_jax.config import UserError, load_config
from sera_jax.warmstart.demos import RecordingGenerator, demo_datums
from sera_jax.warmstart.oracle import TextCraftOracle, parse_targets, rubric_text, score_text
from sera_jax.warmstart.sft import warm_start

CONFIG = "configs/tiny_cpu.yaml"


@pytest.fixture(scope="module")
def cfg():
    return load_config([CONFIG], ["env.num_workers=1"])


@pytest.fixture(scope="module")
def tok(cfg, tmp_path_factory):
    return resolve_tokenizer(cfg.model.tokenizer, None)[0]


def _run_oracle(cfg, tok, tasks, stage="execution", **kw):
    oracle = TextCraftOracle(recipe_book(), tok, max_depth=cfg.env.max_depth, **kw)
    gen = RecordingGenerator(tok, oracle)
    factory = make_launcher_factory(stage, cfg.method_config(), "textcraft",
                                    max_context=runtime_settings(cfg).max_context)

    async def main():
        trees = await run_trees(tasks, "textcraft", gen, tok, runtime_settings(cfg), max_concurrent=4,
                                launcher_factory=factory)
        return await factory.finalize(trees)

    return oracle, gen, asyncio.run(main())


def test_texts_parse():
    assert parse_targets("x\nYour Goal: Craft the following items: 3x o5_i2_15, 1x m0_i1\nBudget: 6") == \
        {"o5_i2_15": 3, "m0_i1": 1}
    assert parse_rubric(rubric_text("Craft the following items: 2x a_i1"))[0] is not None
    assert parse_score(score_text(True))[0].value == 1.0
    s = parse_score(score_text(False))[0]
    assert s.value == 0.0 and not s.success


def test_oracle_solves_easy_tasks_with_and_without_delegation(cfg, tok):
    tasks = [t for t in load_tasks("val") if t.difficulty == "easy"][:3]
    for delegate in (0.0, 1.0):
        oracle, gen, trees = _run_oracle(cfg, tok, tasks, delegate_prob=delegate, fail_prob=0.0)
        assert [t.nodes[t.root_id].reward.environment for t in trees] == [1.0] * len(tasks)
        # launches that created a child (a refused launch is recorded with none)
        delegations = sum(bool(d.child_ids) for t in trees for d in t.delegations)
        assert (delegations > 0) == (delegate == 1.0)
        if delegate:
            # a rubric before every delegation and a score after every child
            kinds = [info.node_id.split(":")[0] for info, _, _ in gen.records if ":" in info.node_id]
            assert kinds.count("rubric") == delegations == kinds.count("score")
            # the children are at the depth limit of the tiny default; their prompt does not show their depth, so
            # the parent's launch context says so, and they craft their ingredients themselves
            assert cfg.env.max_depth == 1
            children = [n for t in trees for n in t.nodes.values() if n.depth == 1]
            assert children and all(n.goal.endswith("Context provided from parent agent: craft it yourself")
                                    and not any("launch_subagent" in tu.code for tu in n.turns) for n in children)
            assert all(not d.child_ids == [] for t in trees for d in t.delegations)  # no launch was refused


def test_sabotaged_children_fail_and_demos_keep_only_good_turns(cfg, tok):
    tasks = [t for t in load_tasks("val") if t.difficulty == "easy"][:2]
    oracle, gen, trees = _run_oracle(cfg, tok, tasks, delegate_prob=1.0, fail_prob=1.0)
    children = [n for t in trees for n in t.nodes.values() if n.depth > 0]
    assert children and all(n.env_labels["success"] == 0.0 for n in children)
    assert {(t.id, n.id) for t in trees for n in t.nodes.values() if n.depth > 0} == oracle.sabotaged
    datums, counts = demo_datums(gen.records, trees, oracle.sabotaged)
    # every agent failed (children sabotaged, roots then short of ingredients): the sabotaged children are not demos,
    # the roots are (they played the gold plan; only their children's sabotage failed them), and so are the calls
    roots = {(t.id, t.root_id) for t in trees}
    assert all(t.nodes[t.root_id].reward.environment == 0.0 for t in trees)
    assert counts["agents_kept"] == len(roots)
    assert {(d.tree_id, d.node_id) for d in datums if d.objective == "execution"} == roots
    assert {d.objective for d in datums} == {"execution", "rubric_generation", "scoring"}
    # the same failures with no sabotage to explain them: no agent is a demo, only the calls
    datums, counts = demo_datums(gen.records, trees, set())
    assert counts["agents_kept"] == 0
    assert {d.objective for d in datums} == {"rubric_generation", "scoring"}
    for d in datums:
        if d.objective == "scoring":
            text = tok.decode([t for t, m in zip(d.tokens, d.mask) if m], skip_special_tokens=True)
            assert parse_score(text)[0].success is False


def _missed_rubrics(cfg, tok, tasks, miss):
    """Plays ``tasks`` with half the demo rubrics missed as ``miss``; returns (oracle, scored children, those whose
    rubric gate is "task done", the others)."""
    oracle, _, trees = _run_oracle(cfg, tok, tasks, delegate_prob=1.0, fail_prob=0.5, rubric_target_prob=0.5,
                                   rubric_miss=miss)
    scored = [n for t in trees for n in t.nodes.values() if n.depth > 0 and n.rubric_score is not None]
    missed = [n for n in scored if n.rubric_score.rubric["success_gate"] == "task done"]
    return oracle, scored, missed, [n for n in scored if n not in missed]


def test_distractor_rubrics_make_the_oracles_scores_follow_its_rubric(cfg, tok):
    """With rubric_target_prob < 1 some demo rubrics name another item of the goal's tier, and a child scored against
    one scores 0 although it crafted its goal: the warm start's rubrics rank imperfectly by construction."""
    tasks = [t for t in load_tasks("val") if t.difficulty == "easy"][:6]
    oracle, gen, trees = _run_oracle(cfg, tok, tasks, delegate_prob=1.0, fail_prob=0.0, rubric_target_prob=0.5)
    children = {(t.id, n.id): n for t in trees for n in t.nodes.values()
                if n.depth > 0 and n.rubric_score is not None}
    assert children and all(n.env_labels["success"] == 1.0 for n in children.values())  # none sabotaged: all crafted
    named = {k: n.rubric_score.rubric["success_gate"].removesuffix(" crafted") for k, n in children.items()}
    goal = {k: n.goal.split("Craft the following items: ", 1)[1].split("\n")[0] for k, n in children.items()}
    right = {k for k in named if named[k].split(" Context")[0] == goal[k].split(" Context")[0]}
    wrong = set(named) - right
    assert right and wrong, (named, goal)  # both kinds occur (draws at 1/2)
    assert oracle.rubrics["distractor"] == len(wrong) and oracle.rubrics["target"] == len(right)
    for k, n in children.items():
        assert n.rubric_score.success == (k in right) and n.rubric_score.score == float(k in right)
        if k in wrong:  # a distractor: same amount, another craftable item
            (amount, item), (amount2, item2) = [x.split("x ", 1) for x in (named[k].split(",")[0],
                                                                           goal[k].split(",")[0])]
            assert amount == amount2 and item != item2 and recipe_book().can_craft(item.split(" ")[0])
    # Vague misses: no target named, every child scored against one gets 0.5 (a tie), the others their outcome.
    oracle, scored, vague, named = _missed_rubrics(cfg, tok, tasks, "vague")
    assert vague and named and oracle.rubrics["vague"] == len(vague) and oracle.rubrics["distractor"] == 0
    assert all(n.rubric_score.score == 0.5 for n in vague)
    assert all(n.rubric_score.score == n.env_labels["success"] for n in named)
    assert {n.env_labels["success"] for n in scored} == {0.0, 1.0}  # sabotage still fails some children
    # Generic misses: the target rubric (its description still naming the goal) with its first item "progress" and
    # gate "task done" — what the scorer is shown changes, the writer's template and copying do not.
    oracle, scored, generic, named = _missed_rubrics(cfg, tok, tasks, "generic")
    assert generic and named and oracle.rubrics["generic"] == len(generic) and oracle.rubrics["vague"] == 0
    for n in scored:
        r, goal = n.rubric_score.rubric, n.goal.split("Craft the following items: ", 1)[1].split("\n")[0]
        assert list(r) == list(scored[0].rubric_score.rubric)  # one template
        assert r["rubric_items"][0]["description"].endswith(goal.split(" Context")[0])  # the goal copied either way
        assert r["rubric_items"][0]["name"] == ("progress" if n in generic else "crafted")
    assert all(n.rubric_score.score == 0.5 for n in generic)
    assert all(n.rubric_score.score == n.env_labels["success"] for n in named)
    # The default (1.0) keeps the old oracle: every rubric names the goal, every score is the true outcome.
    oracle, _, trees = _run_oracle(cfg, tok, tasks[:2], delegate_prob=1.0, fail_prob=0.0)
    assert oracle.rubrics["distractor"] == 0
    assert all(n.rubric_score.success for t in trees for n in t.nodes.values() if n.rubric_score is not None)


def test_exhausting_sabotage_runs_out_of_steps_and_is_scored_zero(cfg, tok):
    """With ``exhaust_share`` a sabotaged child never crafts its target: it repeats a lookup until its step budget
    ends (a long failure, like a sampled policy's), is not a demo itself, and its scoring call — whose prompt the
    context cut — teaches the score 0."""
    tasks = [t for t in load_tasks("val") if t.difficulty == "easy"][:2]
    oracle, gen, trees = _run_oracle(cfg, tok, tasks, delegate_prob=1.0, fail_prob=1.0, exhaust_share=1.0)
    children = [n for t in trees for n in t.nodes.values() if n.depth > 0]
    assert children and {(t.id, n.id) for t in trees for n in t.nodes.values() if n.depth > 0} == oracle.sabotaged
    for n in children:
        assert n.env_labels["success"] == 0.0 and n.finish_message is None
        assert len(n.turns) == cfg.env.max_steps and "Exhausted budget" in (n.error_message or "")
    datums, counts = demo_datums(gen.records, trees, oracle.sabotaged)
    assert not {(d.tree_id, d.node_id) for d in datums if d.objective == "execution"} & oracle.sabotaged
    scores = [d for d in datums if d.objective == "scoring"]
    assert len(scores) == len(children)
    for d in scores:
        text = tok.decode([t for t, m in zip(d.tokens, d.mask) if m], skip_special_tokens=True)
        assert parse_score(text)[0].success is False and parse_score(text)[0].value == 0.0
    # a child's six turns make a scoring prompt longer than the side-call budget: it is cut to fit the context
    budget = cfg.rollout.context_tokens - cfg.method.max_scoring_tokens
    assert max(sum(1 for m in d.mask if not m) for d in scores) == budget
    # exhaust_share 0 leaves the plans (and so the shipped warm start's demos) as they were
    a = TextCraftOracle(recipe_book(), tok, max_depth=1, fail_prob=0.5, seed=3)
    b = TextCraftOracle(recipe_book(), tok, max_depth=1, fail_prob=0.5, exhaust_share=0.0, seed=3)
    for i in range(20):
        key = ("t", f"root/subagent-{i}")
        assert a.plan({"o0_i1_10": 2}, 1, key) == b.plan({"o0_i1_10": 2}, 1, key)


def test_fork_demos_rubric_prompt_and_branch_scores(cfg, tok):
    """Demo trees played as in the rubric-generation stage: each fork group gets the oracle's rubric for the
    post-hoc prompt (which shows the parent's whole reply, thought and tags included, as the execution stage's
    does) and each branch the score of its own outcome (sabotaged branches fail and are scored 0)."""
    from sera_jax.warmstart.demos import collect_demos
    from sera_jax.warmstart.oracle import scored_node

    assert scored_node("score:root/subagent-1-0") == "root/subagent-1-0"
    assert scored_node("score:textcraft_synth.train.1#3:fg0:root/subagent-1-0#b2") == "root/subagent-1-0#b2"
    tasks = [t for t in load_tasks("val") if t.difficulty == "easy"][:3]
    oracle, gen, trees = _run_oracle(cfg, tok, tasks, stage="rubric_generation", delegate_prob=1.0, fail_prob=0.5)
    groups = [g for t in trees for g in t.fork_groups]
    assert groups and all(g.complete and len(g.branches) == cfg.method.branching_factor for g in groups)
    outcomes = [b.success for g in groups for b in g.branches]
    assert True in outcomes and False in outcomes  # sabotage mixes the branches
    for g in groups:
        assert g.rubric is not None
        prompt = tok.decode(g.rubric_turn.prompt_ids)
        assert "[Delegation]\n<thought>" in prompt and "</python>" in prompt
        assert [b.score for b in g.branches] == [1.0 if b.success else 0.0 for b in g.branches]
    small = dataclasses.replace(cfg, warmstart=dataclasses.replace(cfg.warmstart, fork_demo_tasks=2, copy_demos=0,
                                                                   delegate_prob=1.0))
    datums, stats = asyncio.run(collect_demos(small, tok, tasks))
    assert stats["demo_trees"] == 3 and stats["fork_demo_trees"] == 2 and stats["fork_groups"] >= 1
    rubric_prompts = [tok.decode([t for t, m in zip(d.tokens, d.mask) if not m]) for d in datums
                      if d.objective == "rubric_generation"]
    assert rubric_prompts and all("[Delegation]\n<thought>" in p for p in rubric_prompts)  # both stages: whole reply


def test_demo_datums_train_exactly_the_completions(cfg, tok):
    from sera_jax.warmstart.demos import first_turn_prompt, goal_copy_datums

    tasks = [t for t in load_tasks("val") if t.difficulty == "easy"][:2]
    oracle, gen, trees = _run_oracle(cfg, tok, tasks, delegate_prob=1.0, fail_prob=0.0)
    # the synthetic goal-copying turns are token for token what the runtime sends an agent at its first turn
    for info, prompt, completion in gen.records:
        if info.turn == 0 and ":" not in info.node_id:
            node = next(t for t in trees if t.id == info.tree_id).nodes[info.node_id]
            assert first_turn_prompt(cfg, tok, node.goal) == prompt
            assert tok.decode(completion).startswith("<thought>")
    copies = goal_copy_datums(cfg, tok, tasks, oracle, 20, seed=0)
    assert len(copies) == 20 and all(tok.decode([t for t, m in zip(d.tokens, d.mask) if m]).endswith("</python>")
                                     for d in copies)
    # a sub-agent's copy turn carries the context its parent's launch gives it at the depth limit, as at run time
    ctx = "Context provided from parent agent: craft it yourself"
    assert {d.traj_depth for d in copies} == {0, 1}
    assert all((ctx in tok.decode([t for t, m in zip(d.tokens, d.mask) if not m])) == (d.traj_depth == 1)
               for d in copies)
    datums, counts = demo_datums(gen.records, trees, oracle.sabotaged)
    assert counts["agents_kept"] == counts["agents"] > 0
    completions = sum(len(c) for info, p, c in gen.records)
    assert sum(d.num_trained for d in datums) == completions
    for d in datums:
        trained = tok.decode([t for t, m in zip(d.tokens, d.mask) if m])
        assert trained.endswith("<|im_end|>") or trained.endswith("</python>")


@pytest.mark.slow
def test_short_warm_start_learns_and_is_loadable(cfg, tmp_path):
    from sera_jax.training.build import initial_params_from_run

    small = dataclasses.replace(cfg, warmstart=dataclasses.replace(cfg.warmstart, demo_tasks=3, steps=6,
                                                                   token_budget=4096, warmup_steps=1))
    out = warm_start(small, tmp_path / "ws", log=lambda m: None)
    rows = [json.loads(x) for x in (out / "warmstart_metrics.jsonl").read_text().splitlines()]
    assert len(rows) == 6
    assert rows[-1]["nll"] < rows[0]["nll"]
    params = initial_params_from_run(out, small.model_config())
    assert jax.tree.structure(params) is not None
    leaves = jax.tree.leaves(params)
    assert all(np.all(np.isfinite(np.asarray(x))) for x in leaves)
    # a second call finds the checkpoint and does nothing
    msgs = []
    warm_start(small, out, log=msgs.append)
    assert msgs and "using the checkpoint" in msgs[0]
    with pytest.raises(UserError, match="another architecture"):
        initial_params_from_run(out, dataclasses.replace(small.model_config(), hidden_size=64))
    # Another recipe never reuses it: the old one is moved aside (nothing deleted) and a new one is built.
    other = dataclasses.replace(small, warmstart=dataclasses.replace(small.warmstart, steps=2))
    msgs = []
    warm_start(other, out, log=msgs.append)
    stale = [p for p in tmp_path.iterdir() if p.name.startswith("ws.stale-")]
    assert len(stale) == 1 and (stale[0] / "checkpoints").is_dir() and "moved to" in msgs[0]
    assert len((out / "warmstart_metrics.jsonl").read_text().splitlines()) == 2
    assert json.loads((out / "warmstart_recipe.json").read_text())["origin"] == "built"


def test_shipped_warm_start_is_the_default_configs():
    """The package's warm start was built from exactly the tiny default's recipe (else it would not be used)."""
    from sera_jax.model import load_pretrained
    from sera_jax.warmstart.sft import SHIPPED_DIR, recipe, shipped_matches

    cfg = load_config([CONFIG])
    assert shipped_matches(cfg), "rebuild it: sera-warmstart --ship"
    model_cfg, _ = load_pretrained(SHIPPED_DIR)
    assert model_cfg.hidden_size == cfg.model_config().hidden_size
    changed = load_config([CONFIG], ["warmstart.steps=7"])
    assert recipe(changed) != recipe(cfg) and not shipped_matches(changed)


def _datum(n, tag=0):
    from sera_jax.rl.datums import Datum
    return Datum(tokens=(tag,) * n, mask=(0,) + (1,) * (n - 1), logprobs=(0.0,) * n, versions=(0,) * n,
                 reward=1.0, advantage=1.0, objective="execution", traj_depth=0, traj_start=0, node_id=str(tag))


def test_by_length_batches_fill_one_micro_batch_of_one_bucket_and_cover_every_datum():
    from sera_jax.rl.batch import bucket_length, pack_datums
    from sera_jax.warmstart.sft import _batches_by_length

    buckets = (64, 128, 256)
    rng = np.random.default_rng(0)
    # Like the TextWorld demos: mostly short datums (calls, first turns), some whole episodes.
    lengths = np.where(rng.random(300) < 0.8, rng.integers(2, 65, size=300), rng.integers(129, 257, size=300))
    datums = [_datum(int(n), i) for i, n in enumerate(lengths)]
    batches = list(_batches_by_length(datums, 512, 10_000, 0, buckets))
    seen = []
    for b in batches:
        T = {bucket_length(len(d.tokens) - 1, buckets) for d in b}
        assert len(T) == 1  # one bucket per update
        packed = pack_datums(b, token_budget=512, buckets=buckets)
        assert len(packed.micro_batches) == 1 and packed.micro_batches[0].tokens.shape[1] == T.pop()
        seen += [d.node_id for d in b]
    # Each epoch holds every datum exactly once; the updates run on into further epochs.
    assert sorted(seen[:len(datums)], key=int) == [d.node_id for d in datums]
    assert len(seen) > 10 * len(datums)
    # A fixed seed gives the same batches; another seed another order.
    again = [[d.node_id for d in b] for b in _batches_by_length(datums, 512, 40, 0, buckets)]
    assert again == [[d.node_id for d in b] for b in batches[:40]]
    other = [[d.node_id for d in b] for b in _batches_by_length(datums, 512, 40, 1, buckets)]
    assert other != again

    # The point of it: above, every datum sat in rows of its own bucket; mixed batching puts most short datums in
    # the rows of their update's longest bucket (4× the attention per token here), padding them.
    from sera_jax.warmstart.sft import _batches

    short_in_long_rows = short = 0
    for b in _batches(datums, 512, 100, 0):
        T = pack_datums(b, token_budget=512, buckets=buckets).micro_batches[0].tokens.shape[1]
        n = sum(len(d.tokens) - 1 <= 64 for d in b)
        short += n
        short_in_long_rows += n if T == 256 else 0
    assert short_in_long_rows > 0.5 * short


def test_warmstart_batching_and_decay_enter_the_recipe_only_when_set():
    from sera_jax.warmstart.sft import recipe

    cfg = load_config([CONFIG])
    base = recipe(cfg)["warmstart"]
    assert "batching" not in base and "decay" not in base  # recipes (and the shipped asset) from before stay valid
    on = recipe(load_config([CONFIG], ["warmstart.batching=by_length", "warmstart.decay=true"]))["warmstart"]
    assert on["batching"] == "by_length" and on["decay"] is True
    with pytest.raises(ValueError, match="warmstart.decay"):
        load_config([CONFIG], ["warmstart.decay=true", "warmstart.steps=5", "warmstart.warmup_steps=5"])
    with pytest.raises(ValueError):
        load_config([CONFIG], ["warmstart.batching=sorted"])


def test_learning_curve_png(tmp_path):
    from sera_jax.experiments.default_run import learning_curve
    from sera_jax.training.metrics import MetricsWriter

    w = MetricsWriter(tmp_path)
    for v, stage in enumerate(["execution", "execution", "delegation", "rubric_generation"]):
        extra = ({"rubric_ranking_accuracy": 0.75} if stage == "rubric_generation" else
                 {"subagent_score_accuracy": 0.5, "subagent_score_agreement": 0.9} if stage == "execution" else {})
        w.write(v, "step", {"stage": stage, "root_success": 0.1 * v, "delegation_rate": 0.5, **extra})
    w.close()
    png = learning_curve(tmp_path / "metrics.jsonl", tmp_path / "curve.png", title="t")
    data = png.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 5000
