"""An external rubric writer and scorer against a real ``sera-serve`` in its own process (issue #56): the roles a
tiny twin's config names, built by ``assembly.roles.build_roles`` (the one HTTP client, ``EndpointPolicy``), answer
the rubric and scoring calls of the execution stage's coordinator while a scripted actor plays the tree; the spend
is counted per role; and an unreachable, a slow and a garbage-answering writer or scorer leaves the affected
sub-agent untrainable and counted, the tree whole, the run going on."""

from __future__ import annotations

import asyncio
import socket
import subprocess
import sys
import time

import httpx
import pytest

from envs_py.textcraft import load_tasks
from sera_jax.agents.launchers.rubric import RubricCoordinator
from sera_jax.agents.roles import SPEND_KEY
from sera_jax.agents.rubric_calls import RubricConfig, run_limits
from sera_jax.agents.runtime import run_tree
from sera_jax.agents.scripted import ScriptedGenerator
from sera_jax.assembly.roles import build_roles, close_roles
from sera_jax.assembly.settings import runtime_settings
from sera_jax.assembly.tokenizer import resolve_tokenizer
from sera_jax.config import load_config
from sera_jax.config.roles import ENDPOINT_ENV, MODEL_ENV
from sera_jax.rl.datums import execution_datums
from sera_jax.training.stats import tree_metrics
from tests.agents.rubric_scripts import TC_CHILD, TC_CHILD_OK, TC_ROOT

pytestmark = pytest.mark.slow


def _served_model(url: str) -> str:
    return httpx.get(url + "/v1/models", timeout=10).json()["data"][0]["id"]


def _tree(cfg, tmp_path, overrides=()):
    """Runs one scripted TextCraft tree under the config's roles; returns (tree, stats)."""
    cfg = load_config(["configs/tiny_kimi_rubric_kimi_scorer.yaml"], list(overrides)) if overrides else cfg
    tok, _ = resolve_tokenizer(cfg.model.tokenizer, None)
    settings = runtime_settings(cfg)
    method = cfg.method_config()

    async def main():
        roles = await build_roles(cfg, tokenizer=tok, keep_dir=tmp_path / "roles")
        try:
            launcher = RubricCoordinator("textcraft", RubricConfig.from_method(method, **run_limits(settings)), roles)
            actor = ScriptedGenerator(tok, {"root": TC_ROOT, TC_CHILD: TC_CHILD_OK})
            tree = await run_tree(load_tasks("val")[0], "textcraft", actor, tok, settings, launcher=launcher)
            return tree, await launcher.finalize(tree), roles.describe()
        finally:
            await close_roles(roles)

    return asyncio.run(main())


@pytest.fixture()
def external(server, monkeypatch):
    monkeypatch.setenv(ENDPOINT_ENV, server.url + "/v1")
    monkeypatch.setenv(MODEL_ENV, _served_model(server.url))
    return server


def test_writer_and_scorer_on_a_real_sera_serve(external, tmp_path):
    cfg = load_config(["configs/tiny_kimi_rubric_kimi_scorer.yaml"], ["roles.rubric_writer.retries=0",
                                                                       "roles.scorer.retries=0"])
    tree, stats, roles = _tree(cfg, tmp_path)
    assert roles == {"rubric_writer": "endpoint", "scorer": "endpoint", "selector": "policy"}
    child = tree.nodes[TC_CHILD]
    rec = child.misc["rubric"]
    # The rubric call went over HTTP: its turn holds the server's usage and the chat route.
    spend = tree.misc[SPEND_KEY]
    assert spend["rubric_writer/endpoint"]["calls"] == 1 and spend["rubric_writer/endpoint"]["prompt_tokens"] > 0
    assert rec["rubric_call"]["prompt_tokens"] > 0 and rec["rubric_call"]["completion_tokens"] > 0
    if rec["rubric_error"] == "":  # the tiny model's rubric was valid: it was then scored by the server too
        assert spend["scorer/endpoint"]["calls"] == 1
    m = tree_metrics([tree], env="textcraft")
    assert m["roles/rubric_writer/endpoint/calls"] == 1.0 and "roles/rubric_writer/policy/calls" not in m
    assert m["roles/actor/policy/calls"] == len(tree.root.turns) + len(child.turns)
    # Whatever the served model said, its tokens are no datum: only the actor's turns are.
    assert {d.node_id for d in execution_datums(tree, mode="rubric", filter_errors=False)} <= {"root", TC_CHILD}


def test_scorer_on_a_real_sera_serve_under_the_global_rubric(external, tmp_path):
    """The fixed global rubric (no writer call) and the served scorer: the score request goes over HTTP whatever the
    tiny model writes as rubrics (it garbles many at the tiny default's rubric temperature)."""
    tree, stats, roles = _tree(None, tmp_path, ["roles.rubric_writer.backend=file", "roles.scorer.retries=0"])
    assert roles["rubric_writer"] == "file" and roles["scorer"] == "endpoint"
    spend = tree.misc[SPEND_KEY]
    assert "rubric_writer/file" not in spend and spend["scorer/endpoint"]["calls"] == 1
    assert spend["scorer/endpoint"]["prompt_tokens"] > 0 and spend["scorer/endpoint"]["completion_tokens"] > 0
    child = tree.nodes[TC_CHILD]
    assert stats["scored"] + stats["score_invalid"] == 1
    assert child.skip_gradient_update == (stats["score_invalid"] == 1)
    m = tree_metrics([tree], env="textcraft")
    assert m["roles/rubric_writer/file/calls"] == 0.0 and m["roles/scorer/endpoint/calls"] == 1.0


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.parametrize("fault", ["unreachable", "slow", "garbage"])
def test_a_faulty_external_writer_or_scorer(external, tmp_path, monkeypatch, fault):
    proxy = None
    over = ["roles.rubric_writer.retries=1", "roles.scorer.retries=1", "roles.rubric_writer.backoff_s=0.05",
            "roles.scorer.backoff_s=0.05"]
    if fault == "unreachable":
        monkeypatch.setenv(ENDPOINT_ENV, f"http://127.0.0.1:{_free_port()}/v1")  # nobody listens there
    elif fault == "slow":
        over += ["roles.rubric_writer.timeout_s=0.01", "roles.scorer.timeout_s=0.01"]
    else:  # a real server in front of sera-serve that answers every chat completion with a body that is not JSON
        port = _free_port()
        proxy = subprocess.Popen([sys.executable, "-m", "tests.serving.faulty_proxy", "--upstream",
                                  external.url, "--port", str(port), "--garbage-every", "1"],
                                 stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            try:
                httpx.get(f"http://127.0.0.1:{port}/health", timeout=1)
                break
            except httpx.HTTPError:
                time.sleep(0.2)
        monkeypatch.setenv(ENDPOINT_ENV, f"http://127.0.0.1:{port}/v1")
    try:
        t0 = time.monotonic()
        tree, stats, _ = _tree(None, tmp_path, over)
        took = time.monotonic() - t0
    finally:
        if proxy is not None:
            proxy.terminate()
            proxy.wait(10)
    child = tree.nodes[TC_CHILD]
    # The tree keeps every node and the actor's turns; the sub-agent is untrainable and counted.
    assert set(tree.nodes) == {"root", TC_CHILD} and len(tree.root.turns) == len(TC_ROOT)
    assert child.skip_gradient_update and child.rubric_score is None
    assert stats["rubric_invalid"] == 1 and child.misc["rubric_failure"].startswith("invalid rubric: endpoint")
    spend = tree.misc[SPEND_KEY]["rubric_writer/endpoint"]
    assert spend["calls"] == 2 and spend["failures"] == 2
    assert {d.node_id for d in execution_datums(tree, mode="rubric", filter_errors=False)} == {"root"}
    assert tree_metrics([tree], env="textcraft")["roles/rubric_writer/endpoint/failures"] == 2.0
    assert took < 60
