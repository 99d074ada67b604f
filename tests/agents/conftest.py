"""Fixtures of the runtime tests: a real Qwen-like BPE tokenizer (ChatML special tokens) and task picks."""

from __future__ import annotations

import pytest

from sera_jax.model.tokenizer import load_tokenizer
from tests.model.tokenizer_fixtures import build_qwen_like_tokenizer


@pytest.fixture(scope="session")
def tok(tmp_path_factory):
    return load_tokenizer(build_qwen_like_tokenizer(tmp_path_factory.mktemp("agents_tok")))


@pytest.fixture(scope="session")
def tc_task():
    from envs_py.textcraft import load_tasks

    return load_tasks("val")[0]  # 3x o5_i2_15 from raw_o7 3, raw_o5 9, raw_t6 1 (o3_i1 = 2 raw_o5 -> 4)


@pytest.fixture(scope="session")
def tw_task():
    from envs_py.textworld_sync import load_tasks, oracle_actions

    # The sample's shortest task: two independent dishes (13 oracle actions).
    return min(load_tasks("sample"), key=lambda t: len(oracle_actions(t)))
