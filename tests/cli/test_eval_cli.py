"""``sera-eval``: the command line on official tasks of both environments with the tiny model, and the protocol's
failure rule (a crashing tree is retried once, then counted as a failure — the evaluation goes on)."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from envs_py.textworld_sync import oracle_actions
from sera_jax.agents.harness import CURRENT_TURN
from sera_jax.agents.records import read_jsonl
from sera_jax.agents.scripted import ScriptedGenerator
from sera_jax.config import load_config
from sera_jax.assembly.settings import runtime_settings
from sera_jax.evaluation.passes import PassSpec, evaluate
from sera_jax.evaluation.protocol import load_eval_tasks
from sera_jax.model.tokenizer import load_tokenizer
from tests.model.tokenizer_fixtures import build_qwen_like_tokenizer

ROOT = Path(__file__).resolve().parents[2]
# The paper's protocol is greedy (the tiny default samples at temperature 1, the policy its RL trains).
SMALL = ["eval.max_steps=2", "eval.max_completion_tokens=16", "env.max_depth=1", "eval.concurrency=4",
         "eval.context_tokens=1024", "eval.max_prompt_tokens=960", "eval.temperature=0"]


@pytest.fixture(scope="module")
def jax_cache(tmp_path_factory):
    # Both environments' runs compile the same engine shapes: the second reads them from JAX's persistent cache.
    return {"JAX_COMPILATION_CACHE_DIR": str(tmp_path_factory.mktemp("jax_cache")),
            "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS": "0"}


def _eval(*args, timeout=600, env=None):
    return subprocess.run([sys.executable, "-c", "from sera_jax.cli.eval import main; raise SystemExit(main())",
                           *args], capture_output=True, text=True, timeout=timeout, cwd=ROOT,
                          env={**os.environ, **(env or {})})


def _result(stdout: str) -> dict[str, str]:
    line = [x for x in stdout.splitlines() if x.startswith("RESULT ")][-1]
    return dict(kv.split("=", 1) for kv in line.split()[1:])


@pytest.mark.parametrize("env, extra, n, difficulties", [
    ("textcraft", ["eval.task_set=val", "eval.difficulties=[]"], 2, ["easy", "medium"]),
    ("textworld_sync", ["env.name=textworld_sync", "env.task_set=sample", "eval.task_set=sample",
                        "judge.kind=policy_frozen", "eval.difficulties=[]"], 3, ["easy", "medium", "hard"]),
])
@pytest.mark.slow
def test_sera_eval_tiny_model_on_official_tasks(tmp_path, jax_cache, env, extra, n, difficulties):
    # TextWorld: no checkpoint where model.init_from points (a local runs/tiny_warmstart would be loaded otherwise)
    hermetic = [f"model.init_from={tmp_path / 'none'}"] if env != "textcraft" else []
    out = _eval(*extra, *hermetic, *SMALL, "--tasks", str(n), "--out", str(tmp_path), env=jax_cache)
    assert out.returncode == 0, out.stderr[-3000:]
    res = _result(out.stdout)
    assert res["env"] == env and res["tasks"] == str(n) and res["runs"] == "1"
    rep = json.loads((tmp_path / "report.json").read_text())
    # no checkpoint: the tiny default's policy, i.e. its warm start (TextCraft); the TextWorld variant has no warm
    # start of its recipe, so the tiny architecture from a random init
    assert rep["env"] == env
    if env == "textcraft":
        assert "tiny_warmstart" in rep["source"] and "random init" not in rep["source"]
    else:
        assert rep["source"] == "random init (preset tiny-agent, seed 353)"
    # the paper's protocol settings, with the test's small caps
    s = rep["settings"]
    assert s["temperature"] == 0.0 and s["max_steps"] == 2 and s["max_new_tokens"] == 16 and s["max_depth"] == 1
    assert (s["max_prompt_tokens"], s["max_context"]) == (960, 1024)
    assert list(rep["runs"][0]) == difficulties + ["overall"]
    assert rep["runs"][0]["overall"]["scheduled"] == n
    assert all(rep["runs"][0][d]["scheduled"] == 1 for d in difficulties)
    assert rep["markdown"] in (tmp_path / "report.md").read_text() and rep["markdown"] in out.stdout
    trees = list(read_jsonl(tmp_path / "trees.jsonl"))
    assert sorted(t.task_id for t in trees) == sorted(r["task_id"] for r in rep["tasks"][0])
    for t in trees:
        assert t.misc["env"] == env and t.misc["eval"]["run"] == 0
        turns = [turn for node in t.nodes.values() for turn in node.turns]
        # the tiny engine generated every root turn, greedily and within the completion cap
        assert turns and all(len(turn.completion_ids) <= 16 for turn in turns)
        assert len(t.root.turns) <= 2 and all(len(turn.prompt_ids) <= 960 for turn in turns)
        # a tree that ran cleanly was not retried; the record's success is the root label
        if t.misc["eval"]["error"] is None:
            assert t.misc["eval"]["attempt"] == 0
            assert t.misc["eval"]["success"] == (t.root.env_labels.get("success") == 1.0)


def test_config_error_names_the_key(tmp_path):
    out = _eval("eval.retries=-1", "--out", str(tmp_path), timeout=300)
    assert out.returncode == 2 and "eval.retries" in out.stderr


class Crashing:
    """Raises on every turn of the trees of ``always`` tasks and on the first attempt's trees of ``once`` tasks;
    counts the trees (ids) it was asked for."""

    def __init__(self, inner, always: str, once: str):
        self.inner, self.always, self.once = inner, always, once
        self.trees: dict[str, int] = {}

    async def generate(self, prompt_ids, params, key=None):
        tree_id = CURRENT_TURN.get().tree_id
        self.trees[tree_id] = self.trees.get(tree_id, 0) + 1
        task_id, attempt = tree_id.split("#run")[0], tree_id.rsplit(".", 1)[1]
        if task_id == self.always or (task_id == self.once and attempt == "0"):
            raise RuntimeError(f"injected server error for {tree_id}")
        return await self.inner.generate(prompt_ids, params, key)


def test_a_crashing_tree_is_retried_once_then_counted_as_a_failure(tmp_path, capsys):
    tok = load_tokenizer(build_qwen_like_tokenizer(tmp_path / "tok"))
    cfg = load_config(ROOT / "configs" / "tiny_cpu.yaml",
                      ["env.name=textworld_sync", "env.task_set=sample", "eval.task_set=sample", "judge.kind=policy_frozen",
                       "eval.difficulties=[]",
                       "eval.max_steps=40", "eval.num_runs=2"])
    solved, broken, idle = load_eval_tasks(cfg, 3)
    assert [t.difficulty for t in (solved, broken, idle)] == ["easy", "medium", "hard"]
    plan = [f"<action>{a}</action>" for a in oracle_actions(solved)]
    assert len(plan) <= 40

    def script(info, _prompt):
        # the solved task's root plays the oracle; every other agent writes a reply without an action block
        if info.tree_id.startswith(solved.task_id + "#") and info.node_id == "root" and info.turn < len(plan):
            return plan[info.turn]
        return "thinking"

    holder = {}

    def wrap(gen):
        holder["g"] = Crashing(gen, always=broken.task_id, once=solved.task_id)
        return holder["g"]

    rep = asyncio.run(evaluate(cfg, out_dir=tmp_path / "out", spec=PassSpec(num_tasks=3), generator=ScriptedGenerator(tok, script),
                               tokenizer=tok, wrap_generator=wrap, progress=True))
    # a progress bar per run: tasks done of all, successes so far
    err = capsys.readouterr().err
    assert "evaluation run 1/2" in err and "evaluation run 2/2" in err and "3/3" in err and "success=1/3" in err
    # the evaluation went on: every task of both runs has an outcome
    for run in rep["runs"]:
        assert run["easy"] == {"scheduled": 1, "successful": 1, "errored": 0, "rate": 100.0}
        assert run["medium"] == {"scheduled": 1, "successful": 0, "errored": 1, "rate": 0.0}
        assert run["hard"] == {"scheduled": 1, "successful": 0, "errored": 0, "rate": 0.0}
        assert run["overall"]["rate"] == pytest.approx(100.0 / 3) and run["overall"]["errored"] == 1
    assert rep["mean_std"]["overall"] == [pytest.approx(100.0 / 3), 0.0]
    # TextWorld: also per game (task family), and mean statistics of each task's final tree
    for run in rep["by_game"]:
        assert run["overall"]["scheduled"] == 3 and run["overall"]["successful"] == 1
        assert set(run) - {"overall"} == {t.game for t in (solved, broken, idle)}
    assert rep["tree_means"][0]["nodes"] == 1.0 and rep["tree_means"][0]["agent_errors"] == pytest.approx(1 / 3)
    for records in rep["tasks"]:
        by = {r["task_id"]: r for r in records}
        # retried once after the injected error, then a clean (successful) rollout
        assert by[solved.task_id]["attempts"] == 2 and by[solved.task_id]["success"] is True
        assert "injected server error" in by[solved.task_id]["errors"][0]
        # retried once, failed again: an error, counted as a failure
        assert by[broken.task_id]["attempts"] == 2 and by[broken.task_id]["success"] is None
        assert len(by[broken.task_id]["errors"]) == 2
        assert by[idle.task_id]["attempts"] == 1 and by[idle.task_id]["success"] is False
    # the injected generator saw both attempts of the crashing tasks, in both runs
    seen = holder["g"].trees
    for r in (0, 1):
        for tid in (solved.task_id, broken.task_id):
            assert f"{tid}#run{r}.0" in seen and f"{tid}#run{r}.1" in seen
        assert f"{idle.task_id}#run{r}.1" not in seen
    # every attempt's tree is in the JSONL, the crashed ones with the error on the root
    trees = {t.id: t for t in read_jsonl(tmp_path / "out" / "trees.jsonl")}
    assert len(trees) == 2 * 5
    crashed = trees[f"{broken.task_id}#run0.1"]
    assert crashed.root.rollout_error_zero_reward and "injected server error" in crashed.root.error_message
    assert crashed.misc["eval"] == {"run": 0, "attempt": 1, "error": crashed.misc["eval"]["error"], "success": False}
    assert trees[f"{solved.task_id}#run1.1"].root.env_labels["success"] == 1.0
    md = (tmp_path / "out" / "report.md").read_text()
    assert "| success % (2 runs) | 100.00 ± 0.00 | 0.00 ± 0.00 | 0.00 ± 0.00 | 33.33 ± 0.00 |" in md


def test_best_of_n_is_accepted_for_textcraft():
    cfg = load_config(ROOT / "configs" / "tiny_cpu.yaml", ["eval.best_of_n=2"])
    assert cfg.env.name == "textcraft" and cfg.eval.best_of_n == 2


def test_policy_from_a_run_checkpoint_or_a_hf_directory(tmp_path):
    import jax
    import numpy as np

    from sera_jax.evaluation.protocol import load_policy
    from sera_jax.interop.export import copy_tokenizer
    from sera_jax.model import Qwen3Config, init_params, save_pretrained
    from sera_jax.rl.optim import OptimConfig, make_optimizer
    from sera_jax.training.checkpoint import Checkpointer, model_config_record
    from sera_jax.training.step import init_train_state

    tok_dir = build_qwen_like_tokenizer(tmp_path / "tok")
    model_cfg = Qwen3Config.preset("tiny", vocab_size=640, tie_word_embeddings=False)
    params = init_params(jax.random.key(7), model_cfg)
    ck = Checkpointer(tmp_path / "run" / "checkpoints", every=1)
    ck.save(5, init_train_state(params, make_optimizer(OptimConfig())),
            {"model_config": model_config_record(model_cfg), "tokenizer_path": str(tok_dir)})
    ck.close()
    cfg = load_config(ROOT / "configs" / "tiny_cpu.yaml")

    def same(a, b):
        return all(np.array_equal(np.asarray(x), np.asarray(y)) for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)))

    # a run directory (its checkpoints/ found): the metadata's model config and tokenizer, the newest version
    pol = load_policy(cfg, checkpoint=tmp_path / "run")
    assert pol.model_cfg == model_cfg and same(pol.params, params) and "version 5" in pol.source
    assert pol.tokenizer_path == str(tok_dir) and pol.tokenizer.vocab_size == 601
    # a HF directory with its tokenizer files
    save_pretrained(model_cfg, params, tmp_path / "hf")
    copy_tokenizer(tok_dir, tmp_path / "hf")
    pol = load_policy(cfg, hf_dir=tmp_path / "hf")
    assert pol.model_cfg.vocab_size == 640 and same(pol.params, params) and pol.source.startswith("hf ")
    # (the tiny default — random init, builtin tokenizer built into --out — is what the CLI tests above run)
    with pytest.raises(FileNotFoundError):
        load_policy(cfg, checkpoint=tmp_path / "nothing")


def test_test_time_selection_runs_candidates_at_each_delegation(tmp_path):
    tok = load_tokenizer(build_qwen_like_tokenizer(tmp_path / "tok"))
    cfg = load_config(ROOT / "configs" / "tiny_cpu.yaml",
                      ["env.name=textworld_sync", "env.task_set=sample", "eval.task_set=sample", "judge.kind=policy_frozen",
                       "eval.difficulties=[]",
                       "eval.max_steps=3", "eval.best_of_n=2", "eval.fork_budget=4"])

    def script(info, _prompt):
        if info.node_id == "root" and info.turn < 2:  # two delegations: 2 + 2 forks fit the budget of 4
            return '<delegate>{"goal": "look around the kitchen"}</delegate>'
        return "<finish>done</finish>" if "#c" in info.node_id else "thinking"

    rep = asyncio.run(evaluate(cfg, out_dir=tmp_path / "out", spec=PassSpec(num_tasks=1), generator=ScriptedGenerator(tok, script),
                               tokenizer=tok))
    assert rep["best_of_n"] == 2 and rep["runs"][0]["overall"]["errored"] == 0
    (tree,) = read_jsonl(tmp_path / "out" / "trees.jsonl")
    kinds = [d.kind for d in tree.delegations]
    assert kinds == ["best_of_n", "best_of_n"]
    # each delegation ran N = 2 candidate children on forked worlds
    assert sum(1 for n in tree.nodes if "#c" in n) == 4


@pytest.mark.slow
def test_paper_configs_evaluate_every_difficulty_with_their_caps():
    tw = load_config(ROOT / "configs" / "paper" / "textworld_sera.yaml")
    assert tw.env.difficulties == ("medium", "hard", "extreme")  # the training filter does not apply to evaluation
    tasks = load_eval_tasks(tw, 8)
    assert [t.difficulty for t in tasks[:4]] == ["easy", "medium", "hard", "extreme"]
    s = runtime_settings(tw, evaluation=True)
    assert (s.temperature, s.max_steps, s.max_depth, s.max_prompt_tokens, s.max_context, s.max_new_tokens) == (
        0.0, 20, 3, 10240, 13312, 3072)
    tc = load_config(ROOT / "configs" / "paper" / "textcraft_sera.yaml")
    s = runtime_settings(tc, evaluation=True)
    assert (s.temperature, s.max_steps, s.max_depth, s.max_prompt_tokens, s.max_context, s.max_new_tokens) == (
        0.0, 20, 3, 9728, 10240, 512)
    assert len(load_eval_tasks(tc)) == 632
