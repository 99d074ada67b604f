"""Branch labels: the chat-completions judge against a real local HTTP server (success, garbage, timeout, 5xx then
success, unreachable, token usage), strict reply parsing, the programmatic TextCraft label and the frozen-policy
judge (its token counts and trace spans)."""

from __future__ import annotations

import asyncio
import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from sera_jax.agents.judge import (NO_THINKING, ChatJudge, JudgeUnavailable, PolicyJudge, ProgrammaticJudge,
                                   judge_messages, make_judge, parse_judge_reply, usage_tokens, with_attempts)
from sera_jax.agents.records import Node, Turn
from sera_jax.agents.scripted import ScriptedGenerator
from sera_jax.agents.phases import Trace, tracing


class ChatServer:
    """A chat-completions server on 127.0.0.1 (ephemeral port) answering from a queue of behaviours."""

    def __init__(self, behaviours):
        self.behaviours, self.requests = list(behaviours), []
        server = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *a):
                pass

            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                server.requests.append((self.path, dict(self.headers), body))
                kind, arg = server.behaviours.pop(0) if server.behaviours else ("reply", '{"success": true}')
                if kind == "sleep":
                    time.sleep(arg)
                    kind, arg = "reply", '{"success": true, "reason": "late"}'
                if kind == "status":
                    self.send_response(arg)
                    self.end_headers()
                    return
                usage = None
                if kind == "usage":  # a reply with the usage field the endpoint reports
                    (arg, usage), kind = arg, "reply"
                reply = {"choices": [{"message": {"role": "assistant", "content": arg}}]}
                data = (json.dumps({**reply, **({"usage": usage} if usage else {})}).encode()
                        if kind == "reply" else arg.encode())
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}/v1"
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def close(self):
        self.httpd.shutdown()
        self.httpd.server_close()


def _node():
    return Node(id="root/subagent-0-0", goal="take white onion", depth=1, finish_message="took it",
                turns=[Turn(0, [], [], [], 0, code="<action>take white onion</action>", output="You take it.")])


def _label(judge):
    return asyncio.run(judge.label(_node(), "prepare the meal"))


def test_success_and_request_shape():
    srv = ChatServer([("reply", 'Sure: {"success": true, "reason": "onion taken"} done')])
    try:
        label = _label(ChatJudge(srv.url, "kimi", api_key="k", backoff_s=0.01))
        assert (label.success, label.reason, label.attempts) == (True, "onion taken", 1)
        path, headers, body = srv.requests[0]
        assert path == "/v1/chat/completions" and headers["Authorization"] == "Bearer k"
        assert body["model"] == "kimi" and body["temperature"] == 1.0 and body["max_tokens"] == 1024
        user = body["messages"][1]["content"]
        # The reference's quirk: "Root Task" holds the sub-agent's own goal.
        assert user.startswith("Root Task:\ntake white onion") and "Immediate Parent Goal:\nprepare the meal" in user
        assert "You take it." in user
    finally:
        srv.close()


def test_requests_turn_thinking_off():
    """Every request carries the reference's thinking-off fields (``reasoning_effort: none`` and
    ``chat_template_kwargs.enable_thinking: false``, its ``extra_body``); ``extra_body`` replaces them and never
    overrides the core fields."""
    assert NO_THINKING == {"reasoning_effort": "none", "chat_template_kwargs": {"enable_thinking": False}}
    srv = ChatServer([("reply", '{"success": true, "reason": "r"}')] * 3)
    try:
        _label(ChatJudge(srv.url, "kimi-k2.6"))
        body = srv.requests[0][2]
        assert body["reasoning_effort"] == "none" and body["chat_template_kwargs"] == {"enable_thinking": False}
        _label(ChatJudge(srv.url, "m", extra_body={}))
        assert not {"reasoning_effort", "chat_template_kwargs"} & set(srv.requests[1][2])
        _label(ChatJudge(srv.url, "m", extra_body={"model": "other", "thinking": {"type": "disabled"}}))
        body = srv.requests[2][2]
        assert body["model"] == "m" and body["thinking"] == {"type": "disabled"} and "reasoning_effort" not in body
    finally:
        srv.close()
    judge = make_judge("textworld_sync", {"kind": "chat", "base_url": "http://127.0.0.1:9/v1", "model": "m"})
    assert judge.request_body([])["chat_template_kwargs"] == {"enable_thinking": False}


def test_with_attempts_is_a_copy_with_one_attempt():
    """The execution judge's single attempt is a per-use copy: the configured (RT) judge keeps its retries."""
    srv = ChatServer([("status", 500), ("reply", '{"success": true, "reason": "r"}')])
    try:
        rt = ChatJudge(srv.url, "m", max_attempts=3, backoff_s=0.01)
        once = with_attempts(rt, 1)
        label = _label(once)
        assert label.success is None and label.attempts == 1 and len(srv.requests) == 1
        assert rt.max_attempts == 3 and once.url == rt.url and once.extra_body == rt.extra_body
        assert _label(rt).success is True
    finally:
        srv.close()
    programmatic = ProgrammaticJudge()
    assert with_attempts(programmatic, 1) is programmatic
    with pytest.raises(ValueError):
        with_attempts(rt, 0)


def test_garbage_is_retried_then_excluded():
    srv = ChatServer([("reply", "I think it worked"), ("raw", "not json at all"),
                      ("reply", '{"success": "yes", "reason": "x"}')])
    try:
        label = _label(ChatJudge(srv.url, "m", max_attempts=3, backoff_s=0.01))
        assert label.success is None and label.attempts == 3 and "success is not a boolean" in label.error
        assert len(srv.requests) == 3
    finally:
        srv.close()


def test_timeout_then_reply():
    srv = ChatServer([("sleep", 1.5), ("reply", '{"success": false, "reason": "no onion"}')])
    try:
        t0 = time.monotonic()
        label = _label(ChatJudge(srv.url, "m", timeout_s=0.5, backoff_s=0.01))
        assert (label.success, label.attempts) == (False, 2) and time.monotonic() - t0 < 5
    finally:
        srv.close()


def test_timeouts_exhaust_attempts():
    srv = ChatServer([("sleep", 1.0)] * 2)
    try:
        label = _label(ChatJudge(srv.url, "m", timeout_s=0.3, max_attempts=2, backoff_s=0.01))
        assert label.success is None and "within 0.3 s" in label.error
    finally:
        srv.close()


def test_5xx_then_success_on_retry():
    srv = ChatServer([("status", 503), ("status", 500), ("reply", '{"success": true, "reason": "ok"}')])
    try:
        t0 = time.monotonic()
        label = _label(ChatJudge(srv.url, "m", max_attempts=5, backoff_s=0.05))
        assert (label.success, label.attempts) == (True, 3) and len(srv.requests) == 3
        assert time.monotonic() - t0 >= 0.15  # back-off 0.05 then 0.1
    finally:
        srv.close()


def test_token_usage_is_summed_over_requests_and_traced():
    """A 5xx (no reply, so no usage), an invalid reply with usage, then a valid one with usage: 3 judge requests,
    tokens summed over the two that reported usage, one unmetered, and 3 ``judge`` spans in the active trace."""
    ok = '{"success": true, "reason": "ok"}'
    srv = ChatServer([("status", 500), ("usage", ("no json", {"prompt_tokens": 410, "completion_tokens": 7})),
                      ("usage", (ok, {"prompt_tokens": 412, "completion_tokens": 11, "total_tokens": 423}))])
    trace = Trace()
    try:
        with tracing(trace):
            label = _label(ChatJudge(srv.url, "m", max_attempts=3, backoff_s=0.01))
        assert (label.success, label.attempts, label.unmetered) == (True, 3, 1)
        assert (label.prompt_tokens, label.completion_tokens) == (822, 18)
        spans = trace.intervals("judge")
        assert len(spans) == 3 and all(e["node"] == "root/subagent-0-0" for _, _, e in spans)
    finally:
        srv.close()
    srv = ChatServer([("reply", ok)])  # an endpoint that reports no usage: the call is unmetered
    try:
        label = _label(ChatJudge(srv.url, "m"))
        assert (label.attempts, label.prompt_tokens, label.completion_tokens, label.unmetered) == (1, 0, 0, 1)
    finally:
        srv.close()
    assert usage_tokens({"usage": {"prompt_tokens": 3, "completion_tokens": 2}}) == {"prompt_tokens": 3,
                                                                                     "completion_tokens": 2}
    assert usage_tokens({"usage": {"prompt_tokens": "3", "completion_tokens": 2}}) is None
    assert usage_tokens({"usage": None}) is None and usage_tokens([]) is None


def test_unreachable_gives_a_clear_error():
    srv = ChatServer([])
    url = srv.url
    srv.close()  # nothing listens on that port any more
    judge = ChatJudge(url, "m", max_attempts=2, backoff_s=0.01, timeout_s=2)
    label = _label(judge)
    assert label.success is None and "cannot reach" in label.error and url in label.error
    with pytest.raises(JudgeUnavailable, match="policy_frozen"):
        asyncio.run(judge.ensure_reachable())


@pytest.mark.parametrize("text, expect", [
    ('{"success": true, "reason": "r"}', (True, "r")),
    ('```json\n{"success": false, "reason": ""}\n```', (False, "")),
    ('{"success": 1, "reason": "r"}', None),
    ('{"success": true}', None),
    ('{"success": true, "reason": 3}', None),
    ("[true]", None),
])
def test_strict_reply_parsing(text, expect):
    success, reason, err = parse_judge_reply(text)
    assert ((success, reason) == expect) if expect else (success is None and err)


def test_programmatic_label():
    node = _node()
    assert _label(ProgrammaticJudge()).success is False
    node.turns[0].reward_misc["reward/success"] = 1.0
    assert asyncio.run(ProgrammaticJudge().label(node)).success is True


def test_policy_frozen_judge(tok):
    replies = iter(["hmm", '{"success": true, "reason": "fine"}'])
    gen = ScriptedGenerator(tok, lambda info, ids: next(replies))
    judge = make_judge("textworld_sync", {"kind": "policy_frozen"}, generator=gen, tokenizer=tok)
    assert isinstance(judge, PolicyJudge)
    trace = Trace()
    with tracing(trace):
        label = _label(judge)
    assert (label.success, label.attempts) == (True, 2)
    assert [c[2].node_id for c in gen.calls] == ["judge:root/subagent-0-0#1", "judge:root/subagent-0-0#2"]
    # Tokens: the prompt ids sent and the completion ids generated, over both attempts ("hmm" + <|im_end|>, …).
    assert label.prompt_tokens == sum(c[3] for c in gen.calls) > 0
    replied = len(tok.encode("hmm")) + len(tok.encode('{"success": true, "reason": "fine"}'))
    assert label.completion_tokens == replied + 2 and label.unmetered == 0
    assert [e["node"] for _, _, e in trace.intervals("judge")] == ["judge:root/subagent-0-0#1",
                                                                   "judge:root/subagent-0-0#2"]
    assert judge_messages("g", "p", _node())[0]["role"] == "system"
    assert isinstance(make_judge("textcraft"), ProgrammaticJudge)
