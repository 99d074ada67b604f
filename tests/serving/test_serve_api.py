"""``sera-serve`` on the shipped warm start, asked by the real ``openai`` client over 127.0.0.1: a chat reply, a
stream whose joined deltas equal it, logprobs equal to ``sera-eval``'s engine for the same tokens, top logprobs whole
and streamed, n / stop / seed,
/v1/completions with token ids, /v1/models, /health, /metrics; every bad input of the issue's table answered with an
OpenAI-style 4xx while the server keeps serving; 20 mid-stream disconnects leave the KV block count at its baseline;
SIGTERM drains the request in flight."""

from __future__ import annotations

import asyncio
import time

import httpx
import numpy as np
import openai
import pytest

from sera_jax.config import load_config
from sera_jax.assembly.engines import engine_config
from sera_jax.evaluation.protocol import load_policy
from sera_jax.sampling import Engine, SamplingParams
from tests.serving.conftest import SERVE_FLAGS

MESSAGES = [{"role": "system", "content": "You craft items in Minecraft."},
            {"role": "user", "content": "Goal: craft 1 oak planks. Inventory: 1 oak log."}]


def client(server) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.url + "/v1", api_key="none", max_retries=0, timeout=120)


def model_name(server) -> str:
    return client(server).models.list().data[0].id


def engine_stats(server) -> dict:
    return httpx.get(server.url + "/metrics", timeout=30).json()["engine"]


def test_chat_stream_and_logprobs_match_the_eval_engine(server):
    c, model = client(server), model_name(server)
    r = c.chat.completions.create(model=model, messages=MESSAGES, max_tokens=48, temperature=0, logprobs=True)
    choice = r.choices[0]
    assert choice.message.role == "assistant" and choice.message.content and choice.finish_reason in ("stop", "length")
    assert r.usage.completion_tokens == len(choice.logprobs.content) > 0
    stream = c.chat.completions.create(model=model, messages=MESSAGES, max_tokens=48, temperature=0, stream=True,
                                       stream_options={"include_usage": True})
    deltas, usage, finish = [], None, None
    for chunk in stream:
        if chunk.usage is not None:
            usage = chunk.usage
        for ch in chunk.choices:
            deltas.append(ch.delta.content or "")
            finish = ch.finish_reason or finish
    assert "".join(deltas) == choice.message.content and len([d for d in deltas if d]) > 1
    assert finish == choice.finish_reason and usage.completion_tokens == r.usage.completion_tokens

    # sera-eval's engine (the tiny default's evaluation sizes) on the same prompt ids: the same greedy tokens and
    # the same behaviour logprobs as the server returned.
    cfg = load_config(["configs/tiny_cpu.yaml"])
    policy = load_policy(cfg)
    prompt = policy.tokenizer.encode_chat(MESSAGES)
    assert r.usage.prompt_tokens == len(prompt)
    ecfg = engine_config(cfg, "float32", evaluation=True, model_cfg=policy.model_cfg)
    engine = Engine(policy.model_cfg, policy.params, ecfg, tokenizer=policy.tokenizer)
    try:
        ref = asyncio.run(engine.generate(prompt, SamplingParams(max_new_tokens=48, temperature=0.0,
                                                                 stop_ids=tuple(policy.tokenizer.stop_ids))))
    finally:
        engine.close()
    assert [t.token for t in choice.logprobs.content] == [policy.tokenizer.decode([t]) for t in ref.token_ids]
    np.testing.assert_allclose([t.logprob for t in choice.logprobs.content], ref.logprobs, atol=2e-4)


def test_top_logprobs_whole_streamed_and_in_completions(server):
    c, model = client(server), model_name(server)
    r = c.chat.completions.create(model=model, messages=MESSAGES, max_tokens=24, temperature=0, logprobs=True,
                                  top_logprobs=3)
    content = r.choices[0].logprobs.content
    assert len(content) == r.usage.completion_tokens > 0
    for item in content:
        top = item.top_logprobs
        assert len(top) == 3 and [t.logprob for t in top] == sorted((t.logprob for t in top), reverse=True)
        # greedy: the chosen token is the most likely one, with the same logprob
        assert top[0].token == item.token and abs(top[0].logprob - item.logprob) <= 1e-6
        assert all(t.bytes == list(t.token.encode()) for t in top)
    stream = c.chat.completions.create(model=model, messages=MESSAGES, max_tokens=24, temperature=0, logprobs=True,
                                       top_logprobs=3, stream=True)
    streamed = [x for chunk in stream for ch in chunk.choices if ch.logprobs for x in ch.logprobs.content]
    # The same tokens and alternatives; logprobs to rounding (the second request finds its prompt in the prefix
    # cache, so its prefill runs another program).
    assert [(x.token, [t.token for t in x.top_logprobs]) for x in streamed] == \
        [(x.token, [t.token for t in x.top_logprobs]) for x in content]
    np.testing.assert_allclose([[x.logprob] + [t.logprob for t in x.top_logprobs] for x in streamed],
                               [[x.logprob] + [t.logprob for t in x.top_logprobs] for x in content], atol=1e-4)
    plain = c.chat.completions.create(model=model, messages=MESSAGES, max_tokens=8, temperature=0, logprobs=True)
    assert all(x.top_logprobs == [] for x in plain.choices[0].logprobs.content)
    comp = c.completions.create(model=model, prompt=[3, 4, 5, 6, 7], max_tokens=8, temperature=0, logprobs=2)
    lp = comp.choices[0].logprobs
    assert len(lp.top_logprobs) == len(lp.tokens) == comp.usage.completion_tokens
    for tok, logprob, alts in zip(lp.tokens, lp.token_logprobs, lp.top_logprobs):
        assert 1 <= len(alts) <= 2 and abs(max(alts.values()) - logprob) <= 1e-6 and tok in alts


def test_n_stop_seed_and_completions(server):
    c, model = client(server), model_name(server)
    base = c.chat.completions.create(model=model, messages=MESSAGES, max_tokens=40, temperature=0)
    text = base.choices[0].message.content
    stop = text[len(text) // 2:len(text) // 2 + 3]
    assert len(stop) == 3
    cut = c.chat.completions.create(model=model, messages=MESSAGES, max_tokens=40, temperature=0, stop=[stop])
    assert cut.choices[0].message.content == text[:text.index(stop)] and cut.choices[0].finish_reason == "stop"
    a, b = (c.chat.completions.create(model=model, messages=MESSAGES, max_tokens=24, temperature=1.0, seed=7, n=3)
            for _ in range(2))
    assert [x.message.content for x in a.choices] == [x.message.content for x in b.choices]
    assert len({x.message.content for x in a.choices}) > 1   # each choice its own draw
    assert a.usage.prompt_tokens == base.usage.prompt_tokens  # the prompt counted once for n = 3
    ids = [3, 4, 5, 6, 7]
    comp = c.completions.create(model=model, prompt=ids, max_tokens=8, temperature=0, logprobs=0)
    assert comp.usage.prompt_tokens == 5 and len(comp.choices[0].logprobs.token_logprobs) == comp.usage.completion_tokens
    assert all(lp <= 0 for lp in comp.choices[0].logprobs.token_logprobs)
    two = c.completions.create(model=model, prompt=["Goal: craft a stick", "Goal: craft a door"], max_tokens=6,
                               temperature=0)
    assert [ch.index for ch in two.choices] == [0, 1]
    health = httpx.get(server.url + "/health").json()
    assert health == {"status": "ok", "model": model}
    m = httpx.get(server.url + "/metrics").json()
    assert m["server"]["requests"]["chat"] >= 4 and m["server"]["completion_tokens"] > 0
    assert m["engine"]["blocks_referenced"] == 0 and m["engine"]["cached_tokens"] > 0   # n and repeats hit the cache


def bad_inputs(model: str) -> list[tuple[str, bytes, int, str]]:
    """The issue's bad-input table: (what, raw body, expected status, words the message must hold)."""
    chat = '{"model": "%s", "messages": [{"role": "user", "content": "hi"}]' % model
    return [
        ("malformed JSON", b'{"model": "x", "messages": [', 400, "not valid JSON"),
        ("unknown model", b'{"model": "gpt-17", "messages": [{"role": "user", "content": "hi"}]}', 404,
         "does not exist"),
        ("missing messages", ('{"model": "%s"}' % model).encode(), 400, "messages is required"),
        ("prompt over the context", ('{"model": "%s", "messages": [{"role": "user", "content": "%s"}]}'
                                     % (model, "craft " * 2000)).encode(), 400, "maximum context length"),
        ("max_tokens 0", (chat + ', "max_tokens": 0}').encode(), 400, "max_tokens"),
        ("max_tokens -5", (chat + ', "max_tokens": -5}').encode(), 400, "max_tokens"),
        ("max_tokens over the limit", (chat + ', "max_tokens": 100000}').encode(), 400, "max_tokens"),
        ("n over the limit", (chat + ', "n": 1000}').encode(), 400, "n must be"),
        ("temperature < 0", (chat + ', "temperature": -0.5}').encode(), 400, "temperature"),
        ("invalid UTF-8", b'{"model": "' + model.encode() + b'", "messages": [{"role": "user", "content": "\xff\xfe"}]}',
         400, "UTF-8"),
        ("oversized body", b'{"pad": "' + b"x" * (5 << 20) + b'"}', 413, "exceeds the server's limit"),
        ("top_logprobs over the limit", (chat + ', "top_logprobs": 6, "logprobs": true}').encode(), 400,
         "top_logprobs must be an integer in [0, 5]"),
        ("top_logprobs without logprobs", (chat + ', "top_logprobs": 2}').encode(), 400, "needs logprobs"),
        ("a tool message", ('{"model": "%s", "messages": [{"role": "tool", "content": "x"}]}' % model).encode(),
         400, "role"),
    ]


def test_bad_inputs_get_openai_errors_and_the_server_keeps_serving(server, capsys):
    model = model_name(server)
    rows = []
    with httpx.Client(timeout=60) as h:
        for what, body, status, words in bad_inputs(model):
            r = h.post(server.url + "/v1/chat/completions", content=body, headers={"Content-Type": "application/json"})
            err = r.json()["error"]
            rows.append(f"| {what} | {r.status_code} | {err['message'][:90]} |")
            assert r.status_code == status and words in err["message"], (what, r.status_code, err)
            assert err["type"] and set(err) == {"message", "type", "param", "code"}
            assert h.get(server.url + "/health").status_code == 200   # still answering after each
    with capsys.disabled():
        print("\n| request | status | message |\n|---|---|---|\n" + "\n".join(rows))
    # the openai client maps them to its own errors
    c = client(server)
    with pytest.raises(openai.NotFoundError):
        c.chat.completions.create(model="nope", messages=MESSAGES)
    with pytest.raises(openai.BadRequestError, match="temperature"):
        c.chat.completions.create(model=model, messages=MESSAGES, temperature=-1)
    assert c.chat.completions.create(model=model, messages=MESSAGES, max_tokens=4).choices[0].message is not None


def test_mid_stream_disconnects_free_their_kv_blocks(server, capsys):
    c, model = client(server), model_name(server)
    baseline = engine_stats(server)["blocks_referenced"]
    before = httpx.get(server.url + "/metrics").json()["server"]["disconnects"]
    for i in range(20):
        stream = c.completions.create(model=model, prompt="Goal: craft 1 oak planks. " * 4, max_tokens=400,
                                      temperature=1.0, seed=i, stream=True, extra_body={"ignore_eos": True})
        it = iter(stream)
        next(it), next(it)              # two chunks in: the request holds KV blocks now
        stream.close()                  # the client goes away mid-stream (at once: 400 tokens are far from done)
    peak = engine_stats(server)["peak_referenced_blocks"]
    deadline = time.monotonic() + 120   # the server learns of each disconnect asynchronously
    while time.monotonic() < deadline:
        m = httpx.get(server.url + "/metrics", timeout=30).json()
        after, disconnects = m["engine"]["blocks_referenced"], m["server"]["disconnects"] - before
        if after == baseline and disconnects == 20:
            break
        time.sleep(0.2)
    with capsys.disabled():
        print(f"\nKV blocks referenced: baseline {baseline}, during a stream up to {peak}, after 20 mid-stream "
              f"disconnects {after}; disconnects counted {disconnects}")
    assert peak > baseline and after == baseline and disconnects == 20


def test_shutdown_drains_the_request_in_flight(run_dir):
    """SIGTERM while a stream is running: the stream still ends with its finish reason, then the server exits."""
    import signal

    from sera_jax.serving.process import serve_process

    proc = serve_process([str(run_dir)], *SERVE_FLAGS, "--graceful-timeout", "600")
    try:
        c = openai.OpenAI(base_url=proc.url + "/v1", api_key="none", max_retries=0, timeout=600)
        stream = c.completions.create(model=model_name(proc), prompt="Goal: craft 1 stick", max_tokens=200,
                                      temperature=1.0, seed=1, stream=True, extra_body={"ignore_eos": True})
        it = iter(stream)
        first = next(it)
        proc.proc.send_signal(signal.SIGTERM)        # shutdown begins with the request in flight
        rest = list(it)
        assert first.choices and rest and rest[-1].choices[0].finish_reason in ("stop", "length")
        # uvicorn re-raises the signal once it has drained and shut down: the status says SIGTERM, not SIGKILL.
        assert proc.proc.wait(60) in (0, -signal.SIGTERM)
    finally:
        proc.kill()
