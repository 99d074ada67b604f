"""Labels of counterfactual branches (docs/design/algorithm.md §4): programmatic for TextCraft, a binary judge for TextWorld.

* ``ProgrammaticJudge`` — TextCraft: success iff some turn of the branch (scanning from the last) has
  ``reward/success`` > 0, else its final check's label ``env_labels["success"]`` > 0 (crafted delta ≥ targets).
* ``ChatJudge`` — an OpenAI-compatible ``/chat/completions`` endpoint given in config (the paper used an external
  model), asked through the one HTTP client (``sampling/openai_client.py``, ``httpx``'s async client): no thread per
  request, one connection pool per event loop (keep-alive across labels, at most ``max_connections`` open). Each attempt has a timeout bounding the whole request (connect,
  a slow first byte, the body); HTTP errors, timeouts, unreachable hosts and unparseable replies are retried with
  exponential back-off up to ``max_attempts`` (3 for the branch judge: 2 retries; the spec's external client
  allows 5). A judge that still fails returns a label with
  ``success=None`` (the branch is excluded) and an ``error`` that names the endpoint and the last cause.
  ``ensure_reachable()`` raises ``JudgeUnavailable`` with that clear message, for a check at start-up.
  Every request turns the model's thinking off with the reference's fields (``NO_THINKING``: ``"reasoning_effort":
  "none"`` and ``"chat_template_kwargs": {"enable_thinking": false}``, sent beside ``model``/``messages`` as the
  reference's ``extra_body``, ``Training/runtime/kimi_judge/client.py`` and ``textworld_rao_policy_judge/judge.py``);
  ``extra_body`` replaces them (``{}`` sends none, for an endpoint that rejects unknown fields).
  ``style="compact"`` sends ``compact_judge_messages``, as ``PolicyJudge`` does: a tiny policy served by
  ``sera-serve`` then answers the same prompt over HTTP as in process.
* ``PolicyJudge`` — the ``policy_frozen`` judge: the same prompt and strict parsing, answered by our own engine
  serving a frozen copy of the initial policy (``frozen_policy_engine``), so labels need no network. With
  ``style="compact"`` (a tiny policy, ``env.prompt_style: compact``) its prompt is ``compact_judge_messages``: the
  goal, the final dish progress, the finish message and the replies, without the observations.

Attempts per label are the judge's ``max_attempts``: 3 for the branch (RT) judge; the TextWorld execution judge of the
RAO family makes one (docs/design/recipes.md §1b Notes) — ``with_attempts(judge, 1)`` returns such a copy of a configured judge.

Supervision spent: a ``Label`` also says how many requests it took (``attempts``, retries and failures included)
and their prompt and completion tokens — from the endpoint's ``usage`` field for ``ChatJudge`` (a request without
one, or without a reply, is counted in ``unmetered``), from the token ids sent and generated for ``PolicyJudge``.
Every request is a ``judge`` span of the active trace (``trace.py``; back-off sleeps are not inside a span).

The judge prompt (§4): the sub-agent's goal is judged on its own steps and outputs, for its immediate parent; the
"Root Task" field holds the sub-agent's own goal (a quirk of the reference, kept). Reply: one JSON object
``{"success": bool, "reason": str}``; anything else is invalid.
"""

from __future__ import annotations

import asyncio
import copy
import dataclasses
import json
from typing import Any, Mapping, Sequence

import jax

from sera_jax.agents.env_name import EnvName
from sera_jax.agents.environments import environment
from sera_jax.agents.phases import span
from sera_jax.agents.policy_call import CallSpec, policy_call
from sera_jax.agents.records import Node
from sera_jax.agents.rubric import compact_replies, extract_json_object, truncate_context
from sera_jax.parallel.mesh import MeshConfig, make_mesh
from sera_jax.sampling.engine import Engine
from sera_jax.sampling.openai_client import OpenAIClient, usage_tokens

JUDGE_SYSTEM = (
    "You judge one sub-agent of a multi-agent system. Decide whether it completed the goal it was assigned and "
    "produced a useful contribution for its immediate parent agent; do not judge whether the whole root task was "
    "solved. Use only the steps and outputs shown. Reply strictly with one JSON object: "
    '{"success": true or false, "reason": "a short explanation"}.')
STEPS_CHAR_LIMIT = 30_000   # keeps the judge request well inside its 10,240-token prompt budget
# "Thinking off" as the reference's judge clients send it (OpenAI ``extra_body``, merged into the request JSON):
# ``reasoning_effort`` for reasoning-effort APIs, ``chat_template_kwargs.enable_thinking`` for SGLang/vLLM templates.
NO_THINKING: Mapping[str, Any] = {"reasoning_effort": "none", "chat_template_kwargs": {"enable_thinking": False}}


class JudgeUnavailable(RuntimeError):
    """The judge endpoint could not be reached or never gave a usable reply."""


@dataclasses.dataclass(frozen=True)
class Label:
    """A branch label: success (None = no label: the branch is excluded), the judge's reason, attempts made (judge
    requests sent), the last error when no label could be had, and the tokens those requests used (``unmetered``:
    requests whose token counts are unknown, so the token sums are lower bounds when it is non-zero)."""

    success: bool | None
    reason: str = ""
    attempts: int = 0
    error: str = ""
    prompt_tokens: int = 0
    completion_tokens: int = 0
    unmetered: int = 0


def judge_messages(goal: str, parent_goal: str, node: Node) -> list[dict[str, str]]:
    """Returns the judge's (system, user) messages for one sub-agent trajectory."""
    steps = []
    for i, t in enumerate(node.turns):
        steps.append(f"Step {i}\nAction:\n{t.code}\nObservation/Output:\n{t.output}\nError:\n{t.error or '(none)'}"
                     f"\nEnvironment info: {json.dumps(t.reward_misc, sort_keys=True, ensure_ascii=False)}")
    body = truncate_context("\n\n".join(steps) or "(no steps)", STEPS_CHAR_LIMIT)
    user = "\n\n".join([f"Root Task:\n{goal}", f"Immediate Parent Goal:\n{parent_goal}",
                        f"Assigned SubAgent Goal:\n{goal}", f"SubAgent Steps:\n{body}",
                        f"Final message: {node.finish_message!r}; error: {node.error_message!r}",
                        'Answer with {"success": bool, "reason": str} only.'])
    return [{"role": "system", "content": JUDGE_SYSTEM}, {"role": "user", "content": user}]


COMPACT_JUDGE_SYSTEM = ('Judge whether the sub-agent completed its goal. Reply with one JSON object: '
                        '{"success": true|false, "reason": "..."}.')


def dish_progress(observation: str) -> str:
    """Returns the dish-progress lines (``- dish_…``) of a TextWorld observation, or ``(unknown)`` when it has none."""
    lines = [ln for ln in str(observation or "").splitlines() if ln.startswith("- dish_")]
    return "\n".join(lines) or "(unknown)"


def compact_judge_messages(goal: str, node: Node) -> list[dict[str, str]]:
    """Returns the compact judge's (system, user) messages for one TextWorld sub-agent (the tiny CPU default's
    ``policy_frozen`` judge): its goal, the dish progress of its final observation, its finish message and its
    replies — the same evidence, laid out as the compact scorer's, that fits a tiny model's context."""
    steps = [{"code": t.code} for t in node.turns]
    user = "\n\n".join([f"[Goal]\n{goal}", "[Final State]\n" + dish_progress(node.misc.get("final_observation", "")),
                         f"[Finish]\n{node.finish_message}", "[Trajectory]\n" + compact_replies(steps)])
    return [{"role": "system", "content": COMPACT_JUDGE_SYSTEM}, {"role": "user", "content": user}]


def parse_judge_reply(text: str) -> tuple[bool | None, str, str]:
    """Returns (success, reason, "") from the first JSON object of ``text``, or (None, "", why it is invalid):
    success must be a JSON boolean and reason a string."""
    obj = extract_json_object(text if isinstance(text, str) else "")
    if obj is None:
        return None, "", "no JSON object in the judge reply"
    if not isinstance(obj.get("success"), bool):
        return None, "", f"success is not a boolean: {obj.get('success')!r}"
    if not isinstance(obj.get("reason"), str):
        return None, "", "reason is not a string"
    return obj["success"], obj["reason"], ""


class ProgrammaticJudge:
    """TextCraft labels from the checker's records (no model)."""

    backend = None  # no model answers

    async def label(self, node: Node, parent_goal: str = "") -> Label:
        """Returns the programmatic label of a finished branch."""
        for t in reversed(node.turns):
            if "reward/success" in t.reward_misc and float(t.reward_misc["reward/success"]) > 0:
                return Label(True, "checker: targets crafted")
        return Label(bool(float(node.env_labels.get("success", 0.0)) > 0 and not node.rollout_error_zero_reward),
                     "checker")


class ChatJudge:
    """Binary judge behind an OpenAI-compatible chat-completions endpoint (see the module docstring)."""

    backend = "endpoint"  # who answers, as per-role spend names it (config/roles.py)

    def __init__(self, base_url: str, model: str, *, api_key: str | None = None, timeout_s: float = 60.0,
                 max_attempts: int = 3, backoff_s: float = 1.0, temperature: float = 1.0, max_tokens: int = 1024,
                 extra_body: Mapping[str, Any] | None = None, max_connections: int = 64, style: str = "paper"):
        if max_attempts < 1:
            raise ValueError("max_attempts must be ≥ 1")
        if style not in ("paper", "compact"):
            raise ValueError(f"judge prompt style must be 'paper' or 'compact', got {style!r}")
        self.style = style
        # The one HTTP client (sampling/openai_client.py), shared with the evaluated endpoint policy.
        self.client = OpenAIClient(base_url, api_key=api_key, timeout_s=timeout_s, max_connections=max_connections)
        self.url = self.client.base_urls[0] + "/chat/completions"
        self.model, self.api_key, self.timeout_s = model, api_key, timeout_s
        self.max_attempts, self.backoff_s = max_attempts, backoff_s
        self.temperature, self.max_tokens = temperature, max_tokens
        self.max_connections = max_connections
        # Extra request fields (None = the reference's thinking-off fields); they never override the core fields.
        self.extra_body = copy.deepcopy(dict(NO_THINKING if extra_body is None else extra_body))

    def request_body(self, messages: Sequence[dict]) -> dict[str, Any]:
        """Returns the JSON body of one chat-completions request for ``messages``."""
        return {**copy.deepcopy(self.extra_body), "model": self.model, "messages": list(messages),
                "temperature": self.temperature, "max_tokens": self.max_tokens}

    async def aclose(self) -> None:
        """Closes this loop's connection pool (a later request opens a new one)."""
        await self.client.aclose()

    async def _attempt(self, messages: Sequence[dict], node_id: str = "") -> tuple[str | None, str, dict | None]:
        """Returns (reply text | None, why there is none, token usage | None) of one request."""
        with span("judge", node=node_id):
            payload, err, _ = await self.client.attempt("chat/completions", self.request_body(messages))
        if payload is None:
            return None, err, None
        try:
            content = payload["choices"][0]["message"]["content"]
        except (KeyError, IndexError, TypeError) as e:
            return None, f"malformed chat-completions response from {self.url}: {type(e).__name__}: {e}", None
        if not isinstance(content, str):
            return None, f"malformed chat-completions response from {self.url}: message content is not a string", \
                None
        return content, "", usage_tokens(payload)

    async def label(self, node: Node, parent_goal: str = "") -> Label:
        """Returns the judge's label of a finished branch: each of up to ``max_attempts`` tries is one request;
        a transport failure or an invalid reply is retried after back-off. success None = no valid reply."""
        messages = compact_judge_messages(node.goal, node) if self.style == "compact" else \
            judge_messages(node.goal, parent_goal, node)
        last = ""
        spent = _Spent()
        for attempt in range(1, self.max_attempts + 1):
            text, last, usage = await self._attempt(messages, node.id)
            spent.add(usage)
            if text is not None:
                success, reason, last = parse_judge_reply(text)
                if success is not None:
                    return Label(success, reason, attempt, **spent.fields())
                last = f"invalid judge reply: {last}"
            if attempt < self.max_attempts:
                await asyncio.sleep(self.backoff_s * 2 ** (attempt - 1))
        return Label(None, "", self.max_attempts, f"judge at {self.url} gave no label after {self.max_attempts} "
                                                  f"attempts: {last}", **spent.fields())

    async def ensure_reachable(self) -> None:
        """Raises JudgeUnavailable (naming the endpoint and the cause) unless the endpoint answers a tiny request."""
        err = ""
        for attempt in range(1, self.max_attempts + 1):
            text, err, _ = await self._attempt([{"role": "user", "content": 'Reply {"success": true, "reason": ""}'}])
            if text is not None:
                return
            if attempt < self.max_attempts:
                await asyncio.sleep(self.backoff_s * 2 ** (attempt - 1))
        raise JudgeUnavailable(f"TextWorld judge endpoint {self.url} (model {self.model!r}) is unavailable after "
                               f"{self.max_attempts} attempts: {err}. Set judge.base_url to a reachable "
                               "OpenAI-compatible server, or use judge.kind=policy_frozen to label with a frozen copy of the policy.")


class PolicyJudge:
    """The ``policy_frozen`` judge: our own generator (an engine over frozen initial params) answers the prompt."""

    def __init__(self, generator: Any, tokenizer: Any, *, seed: int = 0, temperature: float = 1.0,
                 max_new_tokens: int = 1024, max_prompt_tokens: int = 10240, max_attempts: int = 3,
                 style: str = "paper", backend: str = "frozen"):
        if style not in ("paper", "compact"):
            raise ValueError(f"judge prompt style must be 'paper' or 'compact', got {style!r}")
        # "frozen" (an engine over the starting policy's params) or "policy" (the trainable policy's own engine).
        self.backend = backend
        self.generator, self.tokenizer = generator, tokenizer
        self.key = jax.random.key(seed)
        self.spec = CallSpec(temperature, max_new_tokens, max_prompt_tokens)
        self.max_attempts, self.style = max_attempts, style

    async def label(self, node: Node, parent_goal: str = "") -> Label:
        """Returns the frozen policy's label (success None when no attempt gave a valid reply)."""
        messages = compact_judge_messages(node.goal, node) if self.style == "compact" else \
            judge_messages(node.goal, parent_goal, node)
        last = ""
        spent = _Spent()
        for attempt in range(1, self.max_attempts + 1):
            r = await policy_call(self.generator, self.tokenizer, messages, self.spec, root_key=self.key,
                                  name=f"judge:{node.id}#{attempt}", tree_id="judge", depth=node.depth)
            spent.add({"prompt_tokens": len(r.turn.prompt_ids), "completion_tokens": len(r.turn.completion_ids)}
                      if r.turn is not None else None)
            if r.error:
                last = r.error
                continue
            success, reason, last = parse_judge_reply(r.text)
            if success is not None:
                return Label(success, reason, attempt, **spent.fields())
        return Label(None, "", self.max_attempts, f"frozen-policy judge failed: {last}", **spent.fields())


class _Spent:
    """Token usage summed over one label's requests; a request without a count is ``unmetered``."""

    def __init__(self) -> None:
        self.prompt_tokens = self.completion_tokens = self.unmetered = 0

    def add(self, usage: dict[str, int] | None) -> None:
        if usage is None:
            self.unmetered += 1
        else:
            self.prompt_tokens += usage["prompt_tokens"]
            self.completion_tokens += usage["completion_tokens"]

    def fields(self) -> dict[str, int]:
        return {"prompt_tokens": self.prompt_tokens, "completion_tokens": self.completion_tokens,
                "unmetered": self.unmetered}


def frozen_policy_engine(model_cfg: Any, params: Any, engine_config: Any, tokenizer: Any, device: Any = None) -> Any:
    """Returns an Engine on ``device`` (default: the first) serving a private copy of ``params`` (the initial
    policy), unaffected by later updates: the engine places its weights without aliasing the caller's buffers, and
    nothing ever calls its ``load_weights``."""

    mesh = None if device is None else make_mesh(MeshConfig(1, 1, 1), [device])
    return Engine(model_cfg, params, engine_config, tokenizer=tokenizer, mesh=mesh)


def with_attempts(judge: Any, max_attempts: int) -> Any:
    """Returns a copy of ``judge`` that makes at most ``max_attempts`` requests per label (``ChatJudge``,
    ``PolicyJudge``: the same endpoint / engine, settings and key); a judge without attempts (``ProgrammaticJudge``, a
    scripted one) is returned as it is."""
    if max_attempts < 1:
        raise ValueError("max_attempts must be ≥ 1")
    if not hasattr(judge, "max_attempts"):
        return judge
    out = copy.copy(judge)
    out.max_attempts = int(max_attempts)
    return out


def make_judge(env: EnvName, config: dict | None = None, *, generator: Any = None, tokenizer: Any = None) -> Any:
    """Returns the label source for ``env``: programmatic for an environment whose world labels every agent
    (TextCraft); for a judge-labelled one (TextWorld) ``config["kind"]`` chooses
    "chat" (``base_url``, ``model``, optional ``api_key``, ``timeout_s``, ``max_attempts``, ``temperature``,
    ``max_tokens``, ``extra_body``, ``max_connections``, ``style``) or "policy_frozen" (``generator`` = an engine over frozen initial params,
    ``tokenizer``; optional ``temperature``, ``max_new_tokens``, ``max_attempts``)."""
    if environment(env).programmatic:  # the world labels every agent itself
        return ProgrammaticJudge()
    cfg = dict(config or {})
    kind = cfg.pop("kind", "policy_frozen")
    if kind == "chat":
        return ChatJudge(cfg.pop("base_url"), cfg.pop("model"), **cfg)
    if kind == "policy_frozen":
        if generator is None or tokenizer is None:
            raise ValueError("the policy_frozen judge needs a generator (frozen engine) and a tokenizer")
        return PolicyJudge(generator, tokenizer, **cfg)
    raise ValueError(f"unknown judge kind {kind!r}; expected 'chat' or 'policy_frozen'")
