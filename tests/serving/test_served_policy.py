"""What ``sera-serve`` loads (the tokenizer found without being named, for a run and for a HF directory) and the
request pieces that need no server: the streamed text never sends what a stop string will cut, seeds give
reproducible and distinct per-choice keys, and the body checks refuse what they must."""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest

from sera_jax.interop.export import import_pretrained
from sera_jax.serving.completion_text import cut_at_stop, final_text, stable_prefix
from sera_jax.serving.errors import APIError
from sera_jax.serving.openai_requests import Limits, make_plan, parse_json_body
from sera_jax.serving.policy import load_served_policy
from sera_jax.warmstart.sft import SHIPPED_DIRS


def test_the_tokenizer_is_found_for_a_run_and_a_hf_directory(tmp_path):
    run = import_pretrained(SHIPPED_DIRS["textcraft"], tmp_path / "run")
    served = load_served_policy(run)
    assert served.tokenizer_path.endswith("textcraft_tiny.model") and served.name == "run"
    hf = load_served_policy(hf_dir=SHIPPED_DIRS["textworld_sync"])
    assert hf.tokenizer_path.endswith("textworld_tiny.model") and hf.name == "tiny_textworld_warmstart"
    bare = tmp_path / "bare"
    bare.mkdir()
    for name in ("config.json", "model.safetensors"):
        shutil.copy(SHIPPED_DIRS["textcraft"] / name, bare / name)
    with pytest.raises(FileNotFoundError, match="--tokenizer"):
        load_served_policy(hf_dir=bare)
    assert load_served_policy(hf_dir=bare, tokenizer="builtin:textcraft").tokenizer_path == served.tokenizer_path
    with pytest.raises(ValueError):
        load_served_policy(run, hf_dir=bare)


def test_streamed_text_is_a_prefix_of_the_final_text():
    tok = load_served_policy(hf_dir=SHIPPED_DIRS["textcraft"]).tokenizer
    ids = tok.encode("craft 1 stick then craft 2 oak planks <|im_end|>")
    stops = ("oak",)
    final = final_text(tok, ids, stops)
    assert final == tok.decode(ids, skip_special_tokens=True).split("oak")[0]
    for n in range(len(ids) + 1):
        assert final.startswith(stable_prefix(tok, ids[:n], stops))
    assert cut_at_stop("a STOP b stop", ("stop", "STOP")) == ("a ", True)


def test_plans_seeds_and_body_checks():
    limits = Limits(max_context=64, max_tokens=32, max_n=4, max_body_bytes=100)
    plan = make_plan({"n": 3, "seed": 5, "max_tokens": 8}, [[1, 2, 3]], limits, chat=True)
    keys = [plan.key_data(i) for i in range(3)]
    assert all(k.dtype == np.uint32 and k.shape == (2,) for k in keys) and len({k.tobytes() for k in keys}) == 3
    assert np.array_equal(keys[1], make_plan({"n": 3, "seed": 5}, [[1]], limits, chat=True).key_data(1))
    assert make_plan({}, [[1, 2, 3]], limits, chat=True).max_tokens == (32,)       # the default fills the room
    assert make_plan({}, [list(range(50))], limits, chat=False).max_tokens == (14,)
    for body, words in [({"max_tokens": 20}, "maximum context length"), ({"top_p": 0}, "top_p"),
                        ({"stop": ["a"] * 5}, "stop"), ({"seed": 1.5}, "seed"), ({"stream": "yes"}, "stream"),
                        ({"n": True}, "n must be")]:
        with pytest.raises(APIError, match=words):
            make_plan(body, [list(range(50))], limits, chat=True)
    assert parse_json_body(json.dumps({"a": 1}).encode(), 100) == {"a": 1}
    for raw, status in [(b"[1]", 400), (b"\xc3\x28", 400), (b"{" * 101, 413)]:
        with pytest.raises(APIError) as e:
            parse_json_body(raw, 100)
        assert e.value.status == status


def test_a_request_over_its_deadline_is_cancelled_and_frees_its_blocks():
    """The app in process (httpx's ASGI transport) on a real engine, with a 0.3 s deadline: a long request gets a
    504 and is cancelled: the engine counts it cancelled and its KV blocks go back to 0."""
    import asyncio

    import httpx

    from sera_jax.sampling import Engine
    from sera_jax.serving.app import create_app
    from sera_jax.serving.server import ServeOptions, engine_config

    policy = load_served_policy(hf_dir=SHIPPED_DIRS["textcraft"])
    config = engine_config(policy.model_cfg, ServeOptions(max_batch=4, max_context=256))
    engine = Engine(policy.model_cfg, policy.params, config, tokenizer=policy.tokenizer)
    app = create_app(engine, policy.tokenizer, "tiny", Limits(max_context=256, max_tokens=255, deadline_s=0.3))

    async def main():
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://serve") as h:
            r = await h.post("/v1/completions", json={"model": "tiny", "prompt": "Goal: craft 1 stick",
                                                      "max_tokens": 200, "ignore_eos": True, "temperature": 1.0})
            assert r.status_code == 504 and r.json()["error"]["code"] == "deadline_exceeded"
            for _ in range(600):
                m = (await h.get("/metrics")).json()
                if m["engine"]["blocks_referenced"] == 0 and m["engine"]["running"] == 0:
                    break
                await asyncio.sleep(0.1)
            assert m["engine"]["blocks_referenced"] == 0 and m["server"]["deadline_exceeded"] == 1
            assert m["engine"]["cancelled"] >= 1
    try:
        asyncio.run(main())
    finally:
        engine.close()
