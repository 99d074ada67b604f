"""Roles and backends in the config (config/roles.py): old configs resolve as before, new spellings and their
contradictions, the training guard, and endpoint addresses from the environment."""

from __future__ import annotations

from pathlib import Path

import pytest

from sera_jax.assembly.judge import judge_settings
from sera_jax.assembly.roles import endpoint_address
from sera_jax.config import ConfigError, load_config
from sera_jax.config.roles import ENDPOINT_ENV, MODEL_ENV, backend, judge_kind
from sera_jax.config.schema import ROLES
from sera_jax.config.validate import check_trainable_actor

CONFIGS = Path(__file__).resolve().parents[2] / "configs"
ALL = sorted(p for p in [*CONFIGS.glob("*.yaml"), *(CONFIGS / "paper").glob("*.yaml")] if p.name != "mesh_16xh200.yaml")


def _error(*overrides: str, base: str = "tiny_cpu.yaml") -> str:
    with pytest.raises(ConfigError) as e:
        load_config(CONFIGS / base, list(overrides))
    msg = str(e.value)
    assert "\n" not in msg
    return msg


@pytest.mark.parametrize("path", ALL, ids=lambda p: str(p.relative_to(CONFIGS)))
def test_old_configs_resolve_unchanged(path):
    cfg = load_config(path)
    new = {"textcraft_kimi_rubric_policy_scorer", "textcraft_kimi_rubric_kimi_scorer",
           "textcraft_global_rubric_policy_scorer", "tiny_kimi_rubric_policy_scorer", "tiny_kimi_rubric_kimi_scorer",
           "tiny_global_rubric_policy_scorer"}
    if cfg.name in new:
        return
    assert cfg.roles == type(cfg.roles)()  # nobody wrote roles: the reference's defaults
    for role in ("actor", "rubric_writer", "scorer", "selector"):
        assert backend(cfg, role) == "policy"
    # The judge is what judge.kind says, in both spellings, so judge_settings builds what it built before.
    assert judge_kind(cfg) == cfg.judge.kind
    assert backend(cfg, "judge") == {"programmatic": None, "openai": "endpoint",
                                     "policy_frozen": "frozen"}[cfg.judge.kind]


def test_judge_new_spelling_and_contradiction():
    tw = CONFIGS / "tiny_textworld.yaml"
    base = load_config(tw)
    cfg = load_config(tw, ["judge.kind=programmatic", "roles.judge.backend=frozen"])
    assert judge_kind(cfg) == "policy_frozen"
    assert base.judge.kind == "policy_frozen" and judge_settings(cfg) == judge_settings(base)
    assert judge_settings(cfg)["backend"] == "frozen"
    same = load_config(tw, ["judge.kind=openai", "roles.judge.backend=endpoint", "judge.endpoint=http://h:1/v1"])
    assert judge_kind(same) == "openai"
    msg = _error("judge.kind=openai", "roles.judge.backend=frozen", base="tiny_textworld.yaml")
    assert msg.startswith("roles.judge.backend:") and "contradicts judge.kind: openai" in msg and "write" in msg
    msg = _error("roles.judge.backend=endpoint", "judge.kind=openai", "judge.model=a", "roles.judge.model=b",
                 base="tiny_textworld.yaml")
    assert msg.startswith("roles.judge.model:")
    # TextCraft's labels are programmatic: a judge model there is refused in the new spelling.
    assert _error("roles.judge.backend=endpoint").startswith("roles.judge.backend:")


def test_backends_offered_per_role():
    assert "not offered for the scorer" in _error("roles.scorer.backend=file")
    assert "not offered for the selector" in _error("roles.selector.backend=frozen")
    assert _error("roles.scorer.endpoint=http://h:1/v1").startswith("roles.scorer.endpoint:")
    assert _error("roles.rubric_writer.path=x.json").startswith("roles.rubric_writer.path:")
    assert _error("roles.actor.backend=endpoint").startswith("roles.actor.backend:")
    assert _error("roles.rubric_writer.backend=bogus").startswith("roles.rubric_writer.backend:")
    for role in ROLES:
        assert _error(f"roles.{role}.nope=1").startswith(f"roles.{role}.nope: unknown key")


def test_training_guard_refuses_an_external_writer_in_rubric_training():
    msg = _error("roles.rubric_writer.backend=endpoint")  # tiny_cpu: SERA, its schedule has rubric_generation
    assert msg.startswith("roles.rubric_writer.backend: 'endpoint' writes rubrics the trainable policy did not")
    assert "rubric_generation" in msg and "write roles.rubric_writer.backend: policy" in msg
    assert _error("roles.rubric_writer.backend=file").startswith("roles.rubric_writer.backend: 'file'")
    assert _error("roles.rubric_writer.backend=frozen", "method.name=sera_wo_d").startswith("roles.rubric_writer")
    # Without rubric training the writer's tokens train nothing: allowed, scorers and selectors anywhere.
    ok = load_config(CONFIGS / "tiny_cpu.yaml", ["method.stage_schedule=execution:1",
                                                 "roles.rubric_writer.backend=endpoint",
                                                 "roles.scorer.backend=endpoint"])
    assert backend(ok, "rubric_writer") == backend(ok, "scorer") == "endpoint"
    load_config(CONFIGS / "tiny_cpu.yaml", ["roles.scorer.backend=endpoint", "roles.selector.backend=endpoint"])
    served = load_config(CONFIGS / "tiny_cpu.yaml", ["roles.actor.backend=endpoint", "endpoint.urls=http://h:1/v1",
                                                     "endpoint.model=m"])
    with pytest.raises(ConfigError, match=r"^roles\.actor\.backend: 'endpoint' cannot be trained"):
        check_trainable_actor(served)
    check_trainable_actor(load_config(CONFIGS / "tiny_cpu.yaml"))


def test_endpoint_address_from_the_environment(monkeypatch):
    cfg = load_config(CONFIGS / "tiny_cpu.yaml", ["method.stage_schedule=execution:1",
                                                  "roles.rubric_writer.backend=endpoint"])
    monkeypatch.delenv(ENDPOINT_ENV, raising=False)
    monkeypatch.delenv(MODEL_ENV, raising=False)
    with pytest.raises(ConfigError, match=rf"roles.rubric_writer.endpoint: null and \${ENDPOINT_ENV}"):
        endpoint_address(cfg, "rubric_writer")
    monkeypatch.setenv(ENDPOINT_ENV, "http://127.0.0.1:9/v1")
    with pytest.raises(ConfigError, match=rf"roles.rubric_writer.model: null and \${MODEL_ENV}"):
        endpoint_address(cfg, "rubric_writer")
    monkeypatch.setenv(MODEL_ENV, "kimi-k2.6")
    assert endpoint_address(cfg, "rubric_writer") == ("http://127.0.0.1:9/v1", "kimi-k2.6")
    own = load_config(CONFIGS / "tiny_cpu.yaml", ["method.stage_schedule=execution:1",
                                                  "roles.rubric_writer.backend=endpoint",
                                                  "roles.rubric_writer.endpoint=http://h:2", "roles.rubric_writer.model=m"])
    assert endpoint_address(own, "rubric_writer") == ("http://h:2", "m")
    # The judge's endpoint role falls back to the same variables after the judge's own.
    tw = load_config(CONFIGS / "tiny_textworld.yaml", ["judge.kind=programmatic", "roles.judge.backend=endpoint"])
    monkeypatch.delenv("SERA_JUDGE_ENDPOINT", raising=False)
    s = judge_settings(tw)
    assert (s["kind"], s["base_url"], s["model"]) == ("chat", "http://127.0.0.1:9/v1", "kimi-k2.6")


def test_an_endpoint_selector_is_the_oracle_of_test_time_selection():
    from sera_jax.agents.judge import ChatJudge
    from sera_jax.evaluation.protocol import selection_settings

    tiny = CONFIGS / "tiny_cpu.yaml"
    cfg = load_config(tiny, ["eval.best_of_n=2", "roles.selector.backend=endpoint",
                             "roles.selector.endpoint=http://h:1", "roles.selector.model=m", "roles.selector.retries=2"])
    judge = selection_settings(cfg)["roles"].selector_judge
    assert isinstance(judge, ChatJudge) and judge.url == "http://h:1/v1/chat/completions"
    assert (judge.model, judge.max_attempts, judge.temperature) == ("m", 3, cfg.judge.temperature)
    assert "roles" not in selection_settings(load_config(tiny, ["eval.best_of_n=2"]))
    assert selection_settings(load_config(tiny)) is None
