"""One side call of the policy outside an agent's loop: rubric writing, rubric scoring, the frozen-policy judge.

Such a call is a fresh two-message conversation (docs/design/algorithm.md §3.1, §3.3): it is encoded, cut to the prompt budget by the
same §1.3 rule as agent prompts (two messages ⇒ the head of the encoding without the generation prompt), sent to the
generator with its own temperature and completion cap, and recorded as a ``Turn`` (prompt ids as sent, completion
ids, behaviour logprobs, policy version) so that a rubric-generation call can later become a datum.

Calls are named by a ``TurnInfo`` whose ``node_id`` is ``"<call kind>:<subject>"`` (e.g. ``rubric:root/subagent-1-0``)
so that test doubles and traces can tell them from agent turns; their PRNG key folds that name into the tree key.
Each call is a span of the active trace (``trace.py``) whose kind is the name's prefix when it is ``rubric``, ``score``
or ``judge`` (else ``call``), so that step metrics can put rubric writing under generation and scoring and judging
under scoring.
A generator error never propagates: it comes back as ``CallResult.error`` (the policy client makes one attempt and
an error makes the call invalid, docs/design/algorithm.md §3.5).
"""

from __future__ import annotations

import asyncio
import dataclasses
from typing import Any, Sequence

import jax

from sera_jax.agents.harness import CURRENT_TURN, TurnInfo
from sera_jax.agents.keys import turn_key
from sera_jax.agents.phases import SIDE_CALL_KINDS, span
from sera_jax.agents.records import Turn
from sera_jax.agents.truncation import build_prompt
from sera_jax.sampling.types import SamplingParams


def side_call_prompt_budget(agent_prompt_tokens: int, agent_completion_tokens: int, call_tokens: int) -> int:
    """Returns a side call's prompt cap, at least 1: the agents' prompt cap + their completion cap − the call's own
    completion cap (docs/design/recipes.md §1c, the reference's policy client). TextCraft 9,600 + 512 − 1,024 = 9,088;
    TextWorld 10,240 + 3,072 − 1,024 = 12,288 (rubric writing, execution-stage scoring) and − 512 = 12,800
    (rubric-generation-stage scoring)."""
    return max(1, agent_prompt_tokens + agent_completion_tokens - call_tokens)


# TextCraft's rubric and scoring calls (1,024 tokens each): the default of a CallSpec built without a run's caps.
RUBRIC_PROMPT_BUDGET = side_call_prompt_budget(9600, 512, 1024)


@dataclasses.dataclass(frozen=True)
class CallSpec:
    """How one side call samples: temperature, completion cap, prompt budget and serving context."""

    temperature: float
    max_new_tokens: int
    max_prompt_tokens: int = RUBRIC_PROMPT_BUDGET
    max_context: int | None = None   # None: prompt budget + completion cap


@dataclasses.dataclass
class CallResult:
    """The recorded call (``turn`` is None when the call never reached the generator) and the completion text with
    special tokens removed (for parsing); ``error`` is non-empty when the call failed."""

    turn: Turn | None
    text: str = ""
    error: str = ""


async def policy_call(generator: Any, tokenizer: Any, messages: Sequence[dict], spec: CallSpec, *,
                      root_key: jax.Array, name: str, tree_id: str = "", depth: int = 0,
                      timeout_s: float | None = None) -> CallResult:
    """Runs one side call; returns its CallResult (never raises except on cancellation)."""
    try:
        prompt = await asyncio.to_thread(build_prompt, tokenizer, list(messages), spec.max_prompt_tokens)
        context = spec.max_context or spec.max_prompt_tokens + spec.max_new_tokens
        room = context - len(prompt.ids)
        params = SamplingParams(max_new_tokens=max(1, min(spec.max_new_tokens, room)), temperature=spec.temperature,
                                stop_ids=tuple(tokenizer.stop_ids))
        key = turn_key(root_key, name, 0)
    except Exception as e:  # noqa: BLE001  (an unencodable request is just an invalid call)
        return CallResult(None, "", f"request could not be built: {type(e).__name__}: {e}")
    token = CURRENT_TURN.set(TurnInfo(tree_id, name, 0, depth))
    kind = name.split(":", 1)[0]
    try:
        with span(kind if kind in SIDE_CALL_KINDS else "call", tree=tree_id, node=name, turn=0):
            coro = generator.generate(prompt.ids, params, key)
            result = await (asyncio.wait_for(coro, timeout_s) if timeout_s else coro)
    except asyncio.CancelledError:
        raise
    except Exception as e:  # noqa: BLE001  (docs/design/algorithm.md §3.5: a request error makes the call invalid, no retry)
        return CallResult(None, "", f"generation failed: {type(e).__name__}: {e}")
    finally:
        CURRENT_TURN.reset(token)
    ids = [int(t) for t in result.token_ids]
    turn = Turn(index=0, prompt_ids=list(prompt.ids), completion_ids=ids,
                logprobs=[float(x) for x in result.logprobs], policy_version=int(result.policy_version),
                completion_id=f"{tree_id}:{name}", completion_text=tokenizer.decode(ids),
                misc={"call": name, "finish_reason": result.finish_reason, "temperature": spec.temperature,
                      **prompt.info(), **({"usage": dict(result.usage)} if result.usage is not None else {})})
    return CallResult(turn, tokenizer.decode(ids, skip_special_tokens=True), "")


def call_summary(result: CallResult) -> dict[str, Any]:
    """Returns a small JSON-ready summary of a call for records that do not train on it (text, sizes, error)."""
    t = result.turn
    return {"text": result.text, "error": result.error,
            "prompt_tokens": len(t.prompt_ids) if t else 0, "completion_tokens": len(t.completion_ids) if t else 0,
            "finish_reason": t.misc.get("finish_reason") if t else None,
            "policy_version": t.policy_version if t else None}
