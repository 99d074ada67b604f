"""The TextWorld warm start: the oracle plays the compact prompts through the real runtime (shared world, concurrent
sub-agents, rubric coordinator, counterfactual branches, the policy_frozen judge's requests), sabotaged sub-agents
are scored and judged 0 while the root finishes their dish, demo datums train exactly the kept completions, the
first-turn datums are the prompts the runtime sends, and the shipped tokenizer and warm start are the config's."""

from __future__ import annotations

import asyncio
import dataclasses
import json

import pytest

from envs_py.textworld_sync import load_tasks
from sera_jax.agents.judge import parse_judge_reply
from sera_jax.agents.launchers.factory import make_launcher_factory
from sera_jax.agents.rubric import parse_rubric, parse_score
from sera_jax.agents.runtime import run_trees
from sera_jax.agents.subagent_judge import DeferredJudge
from sera_jax.assembly.settings import runtime_settings
from sera_jax.assembly.tasks import load_env_tasks
from sera_jax.assembly.tokenizer import BUILTIN, resolve_tokenizer
from sera_jax.config import load_config
from sera_jax.warmstart.demos import RecordingGenerator
from sera_jax.warmstart.textworld_demos import (
    ENV,
    _judge,
    collect_textworld_demos,
    first_turn_datums,
    verdict_flip_datums,
)
from sera_jax.warmstart.textworld_oracle import (
    TextWorldOracle,
    dish_specs,
    eaten_dishes,
    final_state_span,
    goal_dishes,
    goal_text,
    ingredient_names,
    is_progress,
    judge_text,
    next_action,
    own_goal_action,
    rubric_text,
    score_text,
)

CONFIG = "configs/tiny_textworld.yaml"


@pytest.fixture(scope="module")
def cfg():
    """The default as its demonstrations are played (``demo_env``: 20 own turns per agent, not RL's 10)."""
    from sera_jax.warmstart.sft import demo_env

    c = load_config([CONFIG])
    return dataclasses.replace(c, env=demo_env(c))


@pytest.fixture(scope="module")
def tok(cfg):
    return resolve_tokenizer(cfg.model.tokenizer, None)[0]


@pytest.fixture(scope="module")
def tasks(cfg):
    return load_env_tasks(cfg)[0][:: 50]  # one Easy task of every family


def _play(cfg, tok, tasks, stage="execution", **kw):
    oracle = TextWorldOracle(tok, **kw)
    gen = RecordingGenerator(tok, oracle)
    settings = runtime_settings(cfg)

    async def main():
        factory = make_launcher_factory(stage, cfg.method_config(), ENV, settings=settings,
                                        judge=DeferredJudge() if stage == "rubric_generation" else None)
        trees = await factory.finalize(await run_trees(tasks, ENV, gen, tok, settings, max_concurrent=8,
                                                       launcher_factory=factory))
        judge = _judge(cfg, gen, tok)
        await (judge.label_fork_groups(trees) if stage == "rubric_generation" else judge.label_subagents(trees))
        return trees

    return oracle, gen, asyncio.run(main())


def test_texts_parse():
    task = load_tasks("sample")[0]
    specs = dish_specs(task.goal)
    assert [d for d, _ in specs] == ["dish_1", "dish_2"]
    goal = goal_text(*specs[0])
    assert dish_specs(goal) == [specs[0]] and goal.startswith("Prepare and eat dish_1: ")
    assert ingredient_names("white onion (diced, grilled), salt (raw, uncut), flour") == \
        ["white onion", "salt", "flour"]
    assert dish_specs("Dish dish_2 uses: salt, water.") == [("dish_2", "salt, water")]
    assert parse_rubric(rubric_text(goal))[0]["success_gate"] == "dish_1 eaten"
    assert parse_score(score_text(True))[0].value == 1.0 and not parse_score(score_text(False))[0].success
    assert parse_judge_reply(judge_text(False, ["dish_1"]))[:2] == (False, "dish_1 not eaten")


def test_the_rule_opens_the_gate_takes_the_last_progress_action_else_walks():
    kitchen = "You are in the kitchen.\nVisible objects: (none)"
    pantry = "You are in the pantry.\nVisible objects: salt"
    start = ["look around", "inventory", "go to pantry", "move north", "take knife"]
    assert next_action(start + ["take water"], kitchen) == "take water"
    assert next_action(start + ["take water", "dice white onion", "prepare dish_1"], kitchen) == "prepare dish_1"
    assert next_action(start + ["open door", "take water"], kitchen) == "open door"
    assert next_action(start, kitchen) == "go to pantry"  # nothing left here but the knife (a no-op)
    assert next_action(["look around", "go to kitchen", "move west"], pantry) == "go to kitchen"
    assert [is_progress(a) for a in ("take knife", "take salt", "cook red potato in oven", "eat dish_2",
                                     "go to pantry", "read cookbook")] == [False, True, True, True, False, False]


def test_a_sub_agent_acts_until_its_dish_is_eaten_then_finishes(tok):
    oracle = TextWorldOracle(tok, fail_prob=0.0)
    goal = "Prepare and eat dish_1: salt (raw, uncut)."

    def prompt(progress, valid):
        return (f"<|im_start|>system\nYou are an agent.<|im_end|>\n<|im_start|>user\n# Observation\nYou are in "
                f"the kitchen.\nDish progress:\n{progress}\n\n# Valid Actions\n" + "\n".join(valid) +
                f"\n\n# Task\n{goal}<|im_end|>\n<|im_start|>assistant\n")

    busy = "- dish_1: 0/1 ingredients prepared, meal_prepared=False, meal_eaten=False\n- dish_2: 0/2 ingredients " \
        "prepared, meal_prepared=False, meal_eaten=False"
    assert oracle.agent_reply(prompt(busy, ["look around", "take water"]), "t", "root/a", 1, 3) == \
        "<action>take water</action>"  # another dish's ingredient: it helps
    done = busy.replace("meal_prepared=False, meal_eaten=False", "meal_prepared=True, meal_eaten=True", 1)
    assert oracle.agent_reply(prompt(done, ["look around", "take water"]), "t", "root/a", 1, 3) == \
        "<finish>Prepared and ate dish_1.</finish>"


def test_the_own_goal_rule_acts_only_on_its_own_dish():
    kitchen = "You are in the kitchen.\nVisible objects: (none)"
    specs = dish_specs("Prepare and eat dish_1: white onion (diced), salt (raw, uncut).")
    start = ["look around", "go to pantry", "take knife"]
    assert own_goal_action(start + ["take salt", "take water"], kitchen, specs) == "take salt"  # not the sibling's
    assert own_goal_action(start + ["dice white onion", "take red onion"], kitchen, specs) == "dice white onion"
    assert own_goal_action(start + ["prepare dish_2", "prepare dish_1"], kitchen, specs) == "prepare dish_1"
    assert own_goal_action(start + ["eat dish_2"], kitchen, specs) == "go to pantry"  # nothing of its own here
    assert own_goal_action(start + ["open door", "take salt"], kitchen, specs) == "open door"
    with pytest.raises(ValueError, match="child_rule"):
        TextWorldOracle(None, child_rule="helpful")


def test_under_ten_turns_greedy_children_collide_and_own_goal_children_each_finish_their_dish(tok, tasks):
    """The default's 10 own turns: with the greedy rule both children take the same action from the same
    observation and the world refuses the second (the root finishes the work after they return); with the
    own_goal rule no turn is refused and every child eats its own dish."""
    cfg10 = load_config([CONFIG])
    assert cfg10.env.max_steps == 10
    for rule in ("greedy", "own_goal"):
        _, _, trees = _play(cfg10, tok, tasks, delegate_prob=1.0, fail_prob=0.0, child_rule=rule)
        assert all(t.root.reward.environment == 1.0 for t in trees)
        children = [n for t in trees for n in t.nodes.values() if n.depth]
        refused = sum(bool(x.error) for n in children for x in n.turns)
        own = [all(eaten_dishes(n.misc.get("final_observation", "")).get(d) for d, _ in dish_specs(n.goal))
               for n in children]
        if rule == "greedy":
            assert refused > 0 and not all(own)
        else:
            assert refused == 0 and all(own) and len(children) == 2 * len(trees)


def test_oracle_solves_easy_tasks_with_and_without_delegation(cfg, tok, tasks):
    for prob, children in ((1.0, 2), (0.0, 0)):
        _, gen, trees = _play(cfg, tok, tasks, delegate_prob=prob, fail_prob=0.0)
        assert all(t.root.reward.environment == 1.0 for t in trees), \
            [t.task_id for t in trees if t.root.reward.environment != 1.0]
        assert {len(t.nodes) - 1 for t in trees} == {children}
        for t in trees:  # every sub-agent ate its own dish and said so; the world's steps are within budget
            for n in t.nodes.values():
                if n.depth:
                    assert n.reward.rubric_score == 1.0 and n.reward.judge == 1.0
        root_prompt = tok.decode(gen.records[0][1])
        assert "# Valid Actions\n" in root_prompt and root_prompt.rstrip().endswith("<|im_start|>assistant")


def test_sabotaged_children_are_scored_and_judged_zero_and_the_root_finishes_their_dish(cfg, tok, tasks):
    oracle, _, trees = _play(cfg, tok, tasks, delegate_prob=1.0, fail_prob=1.0)
    children = [n for t in trees for n in t.nodes.values() if n.depth]
    assert len(oracle.sabotaged) == len(children) == 2 * len(trees)
    for n in children:  # each claims its dish and did not eat it
        assert n.finish_message.startswith("Prepared and ate dish_")
        assert n.reward.rubric_score == 0.0 and n.reward.judge == 0.0
    # The root then cooks what is left itself (its budget allows it on most Easy tasks).
    assert sum(t.root.reward.environment for t in trees) >= len(trees) - 2
    assert all(len(t.root.turns) > 1 for t in trees)


def test_fork_demos_rank_branches_with_the_judges_labels(cfg, tok, tasks):
    _, gen, trees = _play(cfg, tok, tasks, "rubric_generation", delegate_prob=1.0, fail_prob=0.5)
    groups = [g for t in trees for g in t.fork_groups]
    assert groups and all(len(g.branches) == cfg.method_config().branching_factor for g in groups)
    for g in groups:
        assert g.rubric is not None and all(b.score is not None for b in g.branches)
        # The judge's label and the branch score agree: both read the branch's final dish progress.
        assert all(b.success == (b.score == 1.0) for b in g.branches)
    assert any(len({b.success for b in g.branches}) == 2 for g in groups)  # some group is ranked
    kinds = {info.node_id.split(":", 1)[0] for info, _, _ in gen.records if info and ":" in info.node_id}
    assert kinds == {"rubric", "score", "judge"}


def test_verdict_flip_demos_differ_from_their_call_only_in_the_final_state_and_the_verdict(cfg, tok, tasks):
    """Every score and judge demo has a twin whose final state says the other verdict: the two prompts share every
    token outside the state's dish lines, and the replies disagree -- so only reading the state fits both."""
    oracle, gen, _ = _play(cfg, tok, tasks, delegate_prob=1.0, fail_prob=0.5)
    calls = [(info, p, c) for info, p, c in gen.records if info and info.node_id.split(":", 1)[0] in ("score", "judge")]
    verdicts = {json.loads(tok.decode(c).replace("<|im_end|>", ""))["success"] for _, _, c in calls}
    assert len(calls) >= 2 * len(tasks) and verdicts == {True, False}  # both verdicts among the originals
    flips = verdict_flip_datums(gen.records, tok, oracle, seed=0)
    assert len(flips) == len(calls)
    sibling_lines = 0
    for (info, prompt, completion), d in zip(calls, flips):
        original = tok.decode(prompt)
        assert tok.encode(original) == list(prompt)  # re-encoding a decoded prompt is exact: the twin is a real prompt
        cut = d.mask.index(1)
        twin = tok.decode(list(d.tokens[:cut]))
        (a0, a1), (b0, b1) = final_state_span(original), final_state_span(twin)
        assert original[:a0] == twin[:b0] and original[a1:] == twin[b1:]
        assert original[a0:a1] != twin[b0:b1]
        reply = json.loads(tok.decode(list(d.tokens[cut:])).replace("<|im_end|>", ""))
        was = json.loads(tok.decode(completion).replace("<|im_end|>", ""))
        assert reply["success"] == (not was["success"]) and d.objective == "scoring"
        assert ("final_score" in reply) == (info.node_id.startswith("score"))
        # A sibling's dish says the opposite of the new verdict: "some meal eaten" is not the child's success.
        siblings = {k: v for k, v in eaten_dishes(twin[b0:b1]).items() if k not in goal_dishes(twin)}
        assert all(v == was["success"] for v in siblings.values())
        sibling_lines += len(siblings)
    assert sibling_lines >= len(tasks)


def test_demos_and_first_turns_are_what_the_runtime_sends(cfg, tok, tasks):
    small = dataclasses.replace(cfg, warmstart=dataclasses.replace(cfg.warmstart, copy_demos=6, fork_demo_tasks=2))
    datums, stats = asyncio.run(collect_textworld_demos(small, tok, tasks))
    assert stats["oracle_root_success"] == 1.0 and stats["judge_calls"] > 0 and stats["score_calls"] > 0
    for d in datums:  # only completions are trained, each ending its reply
        trained = tok.decode([t for t, m in zip(d.tokens, d.mask) if m])
        assert trained and trained.endswith("<|im_end|>")
    # A first-turn datum's prompt is the runtime's first prompt of that agent, token for token.
    oracle = TextWorldOracle(tok, delegate_prob=1.0, fail_prob=0.0)
    first = first_turn_datums(cfg, tok, tasks[:1], oracle, 8, seed=1)
    _, gen, _ = _play(cfg, tok, tasks[:1], delegate_prob=1.0, fail_prob=0.0)
    sent = {tuple(p) for info, p, _ in gen.records if info and info.turn == 0 and ":" not in info.node_id}
    roots = [d for d in first if d.traj_depth == 0]
    assert roots and all(tuple(d.tokens[:d.mask.index(1)]) in sent for d in roots)
    assert any('"delegations"' in tok.decode(list(d.tokens)) for d in roots)


def test_sub_agent_first_turns_start_part_way_and_read_the_action_off_the_valid_list(cfg, tok, tasks):
    """A sub-agent's first-turn datum starts on a world the rule has played part-way; when its first reply acts, its
    second turn continues the prompt as the runtime does (the reply's tokens, that action's observation, the valid
    actions after it), and both replies are the rule's action on the valid list their prompt ends with."""
    import re

    oracle = TextWorldOracle(tok, fail_prob=0.0)
    subs = [d for d in first_turn_datums(cfg, tok, tasks, oracle, 40, seed=5) if d.traj_depth == 1]
    remaining, two = set(), 0
    for d in subs:
        text = tok.decode(list(d.tokens))
        parts = text.split("<|im_start|>assistant\n")
        replies = [p.split("<|im_end|>", 1)[0] for p in parts[1:]]
        trained = tok.decode([t for t, m in zip(d.tokens, d.mask) if m])
        assert trained == "".join(r + "<|im_end|>" for r in replies)
        steps = [int(x) for x in re.findall(r"Shared steps remaining: (\d+)", text)]
        remaining.add(steps[0])
        for prefix, reply in zip(parts, replies):
            valid = prefix.rsplit("# Valid Actions\n", 1)[1].split("\n\n# Task", 1)[0]
            valid = valid.split("<|im_end|>", 1)[0].split("\n# Task", 1)[0].splitlines()
            observation = "You are in the " + prefix.rsplit("You are in the ", 1)[1]
            assert reply.startswith("<finish>") or reply == f"<action>{next_action(valid, observation)}</action>"
        if len(replies) == 2:
            two += 1
            assert steps[1] == steps[0] - 1  # the first action cost one shared step, and the feedback shows it
    assert two >= len(subs) // 2 and len(remaining) > 3  # mostly two turns, from many different points of play


def test_first_turns_come_from_their_own_task_set(cfg, tok, tasks):
    """``warmstart.copy_task_set``: the first-turn datums copy goals of that set's tasks (thousands of them in the
    tiny default, none the evaluation's), not the demo tasks' — so copying is learned, not 200 goals recalled."""
    from envs_py.textworld_sync.task_sets import load_task_set

    spec = "test@800000?difficulties=easy&per_cell=2+test@801000?difficulties=easy&per_cell=2"
    small = dataclasses.replace(cfg, warmstart=dataclasses.replace(cfg.warmstart, copy_demos=12, fork_demo_tasks=0,
                                                                   copy_task_set=spec))
    datums, stats = asyncio.run(collect_textworld_demos(small, tok, tasks[:2]))
    assert stats["first_turn_tasks"] == 28 and stats["first_turn_datums"] == 12
    own = [t.goal for t in load_task_set(spec)[0]]
    first = [tok.decode(list(d.tokens)) for d in datums if d.node_id == "first"]
    assert len(first) == 12 and all(any(goal in text for goal in own) for text in first if "dishes" in text)
    assert any("dishes" in text for text in first)  # some roots among them, each given a task of the set
    assert not any(t.goal in text for t in tasks[:2] for text in first)
    # The held-out evaluation's tasks are never among them, and the setting is TextWorld's only.
    held_out = {t.goal for t in load_task_set(cfg.eval.task_set.split("+")[0])[0]}
    assert held_out.isdisjoint(t.goal for t in load_task_set(cfg.warmstart.copy_task_set)[0])
    with pytest.raises(ValueError, match="copy_task_set"):
        load_config(["configs/tiny_cpu.yaml"], [f"warmstart.copy_task_set={spec}"])


def test_the_tokenizer_rebuilds_to_the_shipped_pieces(tmp_path):
    import sentencepiece as spm

    from sera_jax.warmstart.textworld_tokenizer import build_textworld_tokenizer

    built = build_textworld_tokenizer(tmp_path / "tw.model")
    pieces = [spm.SentencePieceProcessor(model_file=str(p)) for p in (built, BUILTIN["textworld"])]
    assert [pieces[0].id_to_piece(i) for i in range(1024)] == [pieces[1].id_to_piece(i) for i in range(1024)]
    tok = resolve_tokenizer("builtin:textworld", None)[0]
    ids = tok.encode('{"goal": "Prepare and eat dish_1: block of cheese (fried, sliced)."}')
    assert " block of cheese" in [tok.decode([i]) for i in ids]  # a name is one piece, as in the task text



def test_shipped_warm_start_is_the_configs():
    """The package's TextWorld warm start was built from exactly the config's recipe (else it would not be used)."""
    from sera_jax.warmstart.sft import recipe, shipped_dir, shipped_matches

    cfg = load_config([CONFIG])
    assert shipped_dir(cfg).name == "tiny_textworld_warmstart"
    assert shipped_matches(cfg), "rebuild it: sera-warmstart configs/tiny_textworld.yaml --ship"
    stats = json.loads((shipped_dir(cfg) / "warmstart.json").read_text())["stats"]
    assert stats["oracle_root_success"] == 1.0 and stats["judge_calls"] > 0
    changed = load_config([CONFIG], ["warmstart.fail_prob=0.5"])
    assert recipe(changed) != recipe(cfg) and not shipped_matches(changed)
    assert "child_rule" not in recipe(cfg)  # the default rule is not named: recipes from before it stay valid
    own = load_config([CONFIG], ["warmstart.child_rule=own_goal"])
    assert recipe(own)["warmstart"]["child_rule"] == "own_goal" and not shipped_matches(own)


def test_rl_tasks_can_differ_from_the_demo_tasks_and_keep_the_shipped_warm_start():
    """RL on Medium from the Easy warm start: the demo tasks are named apart (warmstart.demo_task_set), the recipe is
    the demos', so the shipped warm start still matches and its demos are still the Easy ones."""
    from sera_jax.assembly.tasks import load_env_tasks
    from sera_jax.warmstart.sft import demo_env, recipe, shipped_matches

    cfg = load_config([CONFIG])
    medium = load_config([CONFIG], ["env.task_set=test@700000?difficulties=medium", "env.difficulties=[medium]",
                                    f"warmstart.demo_task_set={cfg.env.task_set}",
                                    "warmstart.demo_difficulties=[easy]"])
    assert recipe(medium) == recipe(cfg) and shipped_matches(medium)
    demos, _ = load_env_tasks(dataclasses.replace(medium, env=demo_env(medium)))
    rl, _ = load_env_tasks(medium)
    assert {t.difficulty for t in demos} == {"easy"} and {t.difficulty for t in rl} == {"medium"}
    # Without the demo set named, moving the RL tasks moves the recipe: the warm start would be rebuilt on them.
    moved = load_config([CONFIG], ["env.task_set=test@700000?difficulties=medium", "env.difficulties=[medium]"])
    assert recipe(moved) != recipe(cfg) and not shipped_matches(moved)


def test_the_default_runs_rl_under_a_tighter_step_limit_than_its_demos_and_keeps_the_shipped_warm_start():
    """configs/tiny_textworld.yaml: agents limited to 10 turns in RL and evaluation, the demos' limit named
    (warmstart.demo_max_steps: 20), so its recipe is the 20-turn setting's (tiny_textworld_20turns.yaml) and the
    shipped warm start serves both; without the demos' limit named the recipe moves."""
    from sera_jax.warmstart.sft import demo_env, recipe, shipped_matches

    cfg = load_config([CONFIG])
    wide = load_config(["configs/tiny_textworld_20turns.yaml"])
    assert cfg.env.max_steps == cfg.eval.max_steps == 10
    assert wide.env.max_steps == wide.eval.max_steps == demo_env(cfg).max_steps == demo_env(wide).max_steps == 20
    assert recipe(cfg) == recipe(wide) and shipped_matches(cfg) and shipped_matches(wide)
    moved = load_config([CONFIG], ["warmstart.demo_max_steps=null"])
    assert moved.env.max_steps == 10 and recipe(moved) != recipe(cfg) and not shipped_matches(moved)
    with pytest.raises(Exception, match="warmstart.demo_max_steps"):
        load_config([CONFIG], ["warmstart.demo_max_steps=0"])


@pytest.mark.slow
def test_the_shipped_scorer_and_judge_read_the_final_state_not_the_trajectory(cfg, tok, tasks, tmp_path):
    """tools/research/probe_textworld_scorer.py on oracle trees (honest and sabotaged children), each child also
    copied with its final dish line flipped: the shipped warm start's scorer and judge must follow the state. Before the
    verdict-flip demos they scored every child a success whose replies looked like one (and, in training, every
    real failure)."""
    import importlib.util
    import re

    from sera_jax.agents.records import dumps_tree, loads_tree, write_jsonl

    spec = importlib.util.spec_from_file_location("probe_tw", "tools/research/probe_textworld_scorer.py")
    tool = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(tool)
    _, _, trees = _play(cfg, tok, tasks, delegate_prob=1.0, fail_prob=0.5)
    flipped = [loads_tree(dumps_tree(t)) for t in trees]  # the same trees, each child's dish line flipped
    for t in flipped:
        t.id += "-flipped"
        for n in t.nodes.values():
            dish = re.findall(r"dish_\d+", n.goal.split(":", 1)[0])
            if not n.depth or not dish:
                continue
            obs = n.misc.get("final_observation", "")
            line = re.search(rf"- {dish[0]}: (\d+)/(\d+) ingredients prepared, meal_prepared=\w+, meal_eaten=(\w+)", obs)
            total = int(line.group(2))
            new = (f"- {dish[0]}: {total}/{total} ingredients prepared, meal_prepared=True, meal_eaten=True"
                   if line.group(3) == "False" else
                   f"- {dish[0]}: {total - 1}/{total} ingredients prepared, meal_prepared=False, meal_eaten=False")
            n.misc["final_observation"] = obs.replace(line.group(0), new)
    path = tmp_path / "trees.jsonl"
    write_jsonl(list(trees) + flipped, path)
    shipped = dataclasses.replace(cfg, model=dataclasses.replace(cfg.model, init_from=str(tmp_path / "none")))
    out = asyncio.run(tool.probe(shipped, None, [str(path)]))
    acc = out["accuracy"]
    for who in ("scorer", "judge"):
        for truth in ("own dish eaten", "own dish not eaten"):
            right, total = acc[f"{who} on {truth}"]["right"], acc[f"{who} on {truth}"]["of"]
            assert total >= len(tasks) and right >= 0.85 * total, (who, truth, out)
