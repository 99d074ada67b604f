"""The rubric and scoring calls every rubric-using launcher makes (docs/design/algorithm.md §3.1–3.5), on top of ``rubric.py``'s pure
prompt building and parsing: what the rubric writer is shown at a delegation, how a finished child is shown to the
scorer, and the two policy calls with their settings.

What the rubric writer sees per stage (docs/design/recipes.md §3): the same parent reply in every stage (the launch request's
``parent_action``, the whole raw reply); the child tools string of the environment in the execution stage and in
test-time selection, but always TextCraft's in the rubric-generation stage (a reference quirk, kept); the child
budget the delegation asked for (``ChildSpec.budget_shown``).

Each call's prompt cap follows the reference's policy client: the run's agent prompt cap + agent completion cap −
the call's own completion cap (``policy_call.side_call_prompt_budget``), further cut to fit the serving context.

Nothing here reaches an agent's conversation: rubric and score live only in records (docs/design/algorithm.md §12, item 1).
"""

from __future__ import annotations

import dataclasses
from typing import Any

from sera_jax.agents.env_name import EnvName
from sera_jax.agents.environments import environment
from sera_jax.agents.policy_call import (
    CallResult,
    CallSpec,
    policy_call,
    side_call_prompt_budget,
)
from sera_jax.agents.records import Node
from sera_jax.agents.roles import RoleCaller, pause, record_call
from sera_jax.agents.rubric import (
    CHILD_TOOLS_TEXT,
    RubricContext,
    Score,
    child_trajectory_view,
    parse_rubric,
    parse_score,
    rubric_request,
    score_request,
)

FAILURE_POLICIES = ("drop_trajectory", "skip_rollout", "fallback_binary")
# Where a rubric is written: at the launch (execution stage), after the fork group (rubric-generation stage), or
# before choosing among candidates (test-time selection in evaluation).
RUBRIC_STAGES = ("execution", "rubric_generation", "evaluation")


@dataclasses.dataclass(frozen=True)
class RubricConfig:
    """Settings of the rubric calls (docs/design/algorithm.md §8 ``rubric_subagent_reward`` / ``rubric_generation_ranking``).

    ``agent_prompt_tokens`` / ``agent_completion_tokens`` are the run's agent caps (``RuntimeSettings``
    ``max_prompt_tokens`` / ``max_new_tokens``; ``run_limits`` reads them): each call's prompt cap derives from them
    and its own completion cap. The defaults are TextCraft's training caps."""

    rubric_temperature: float = 1.0
    scoring_temperature: float = 0.0
    max_rubric_tokens: int = 1024
    max_scoring_tokens: int = 1024
    min_items: int = 2
    failure_policy: str = "drop_trajectory"
    agent_prompt_tokens: int = 9600
    agent_completion_tokens: int = 512
    max_context: int | None = None   # the serving engine's context: a call's prompt is cut to fit it with its cap

    def __post_init__(self) -> None:
        if self.failure_policy not in FAILURE_POLICIES:
            raise ValueError(f"unknown failure policy {self.failure_policy!r}; expected one of {FAILURE_POLICIES}")
        if self.scoring_temperature != 0.0:
            raise ValueError("scoring temperature must be 0 (docs/design/algorithm.md §3.5)")

    @classmethod
    def from_method(cls, method: Any, **overrides: Any) -> "RubricConfig":
        """Returns the settings a ``rl.stages.MethodConfig`` names, with ``overrides`` applied."""
        base = dict(rubric_temperature=method.rubric_temperature, scoring_temperature=method.scoring_temperature,
                    max_rubric_tokens=method.max_rubric_tokens, max_scoring_tokens=method.max_scoring_tokens,
                    min_items=method.min_rubric_criteria, failure_policy=method.failure_policy)
        base.update(overrides)
        return cls(**base)

    def rubric_spec(self, temperature: float | None = None, max_tokens: int | None = None) -> CallSpec:
        return self._spec(self.rubric_temperature if temperature is None else temperature,
                          max_tokens or self.max_rubric_tokens)

    def scoring_spec(self, max_tokens: int | None = None) -> CallSpec:
        return self._spec(self.scoring_temperature, max_tokens or self.max_scoring_tokens)

    def prompt_budget(self, max_tokens: int) -> int:
        """Returns the prompt cap of a call whose completion cap is ``max_tokens`` (see the module docstring), before
        the serving-context cut."""
        return side_call_prompt_budget(self.agent_prompt_tokens, self.agent_completion_tokens, max_tokens)

    def _spec(self, temperature: float, max_tokens: int) -> CallSpec:
        """The call's settings; with ``max_context`` the prompt budget shrinks so that prompt + completion cap fit
        the engine (a 9,088-token budget on a 1,024-token tiny engine made every long scoring prompt an error)."""
        budget = self.prompt_budget(max_tokens)
        if self.max_context is not None:
            budget = min(budget, self.max_context - max_tokens)
            if budget < 1:
                raise ValueError(f"a side call's completion cap ({max_tokens}) leaves no prompt room in the engine's "
                                 f"context of {self.max_context} tokens")
        return CallSpec(temperature, max_tokens, budget, self.max_context)


def run_limits(settings: Any) -> dict[str, int]:
    """Returns the RubricConfig fields a run's ``RuntimeSettings`` fixes: the agent prompt and completion caps (every
    side call's prompt cap derives from them) and the serving context."""
    return {"agent_prompt_tokens": int(settings.max_prompt_tokens),
            "agent_completion_tokens": int(settings.max_new_tokens), "max_context": int(settings.max_context)}


def child_tools(env: EnvName, stage: str) -> str:
    """Returns the child-tools text of the rubric prompt: the environment's own tools in the execution stage and in
    test-time selection; the TextCraft list in the rubric-generation stage whatever the environment (the reference's
    ranking stage shows it for TextWorld too)."""
    if stage not in RUBRIC_STAGES:
        raise ValueError(f"unknown rubric stage {stage!r}; expected one of {RUBRIC_STAGES}")
    return CHILD_TOOLS_TEXT if stage == "rubric_generation" else environment(env).child_tools_text


def node_view(node: Node) -> dict[str, Any]:
    """Returns the scorer's view of a child: its own steps only (grandchildren appear through its launch outputs)."""
    steps = [{"thought": t.thought, "code": t.code, "output": t.output, "error": t.error} for t in node.turns]
    return child_trajectory_view(node.goal, steps, node.finish_message, node.error_message)


def final_inventory_state(node: Node) -> dict[str, Any]:
    """Returns ``{"inventory": final inventory}`` from the last turn whose reward_misc has one (present only when
    the child called finish), else {} (docs/design/algorithm.md §3.3, execution stage)."""
    for t in reversed(node.turns):
        if "final_inventory" in t.reward_misc:
            return {"inventory": dict(t.reward_misc["final_inventory"])}
    return {}


async def observable_state(env: Any) -> dict[str, Any]:
    """Returns ``env.state()`` or {} when the world cannot say (a dead worker must not end the parent)."""
    try:
        return await env.state()
    except Exception:  # noqa: BLE001
        return {}


def rubric_context(parent: Node, messages: list[dict], action: str, state: dict, child_goal: str, *, env: EnvName,
                   stage: str, child_budget: int, metadata: dict[str, Any]) -> RubricContext:
    """Returns the rubric writer's inputs at one delegation point in ``stage`` (one of RUBRIC_STAGES); ``action`` is
    the parent's whole raw reply (``LaunchRequest.parent_action``) in every stage."""
    return RubricContext(parent_goal=parent.goal, metadata=metadata, parent_messages=messages, parent_action=action,
                         environment_state=state, child_goal=child_goal, child_tools=child_tools(env, stage),
                         child_budget=child_budget)


async def write_rubric(run: Any, ctx: RubricContext, spec: CallSpec, name: str, *, min_items: int,
                       depth: int = 0, caller: RoleCaller | None = None) -> tuple[CallResult, dict | None, str]:
    """Returns (the call, the validated rubric | None, why it is invalid). ``caller`` (default: the policy) says who
    writes it (``agents/roles.py``): a file-backed writer makes no call and returns its fixed rubric; an endpoint
    retries an error or an invalid rubric up to its attempts."""
    caller = caller or RoleCaller("rubric_writer")
    if caller.backend == "file":
        return CallResult(None, "", ""), caller.rubric, ""
    messages = rubric_request(ctx, min_items, style=run.settings.prompt_style)

    def parse(text: str):
        return parse_rubric(text, min_items)
    return await _role_call(run, caller, messages, spec, name, depth, parse)


async def score_node(run: Any, rubric: dict, node: Node, final_state: dict, spec: CallSpec,
                     name: str, *, caller: RoleCaller | None = None) -> tuple[CallResult, Score | None, str]:
    """Returns (the call, the parsed Score | None, why it is invalid) for one finished child under ``rubric``;
    ``caller`` (default: the policy) says who scores it."""
    messages = score_request(rubric, node.goal, node_view(node), final_state, style=run.settings.prompt_style,
                             env=run.settings.env)
    return await _role_call(run, caller or RoleCaller("scorer"), messages, spec, name, node.depth, parse_score)


async def _role_call(run: Any, caller: RoleCaller, messages: list[dict], spec: CallSpec, name: str, depth: int,
                     parse: Any) -> tuple[CallResult, Any, str]:
    generator, tokenizer = caller.plays(run)
    tree = getattr(run, "tree", None)
    res, value, err = CallResult(None, "", "no attempt"), None, "no attempt"
    for attempt in range(1, caller.max_attempts + 1):
        # Retries of one call are distinct requests: each its own name (so its own key and record).
        res = await policy_call(generator, tokenizer, messages, spec, root_key=run.root_key,
                                name=name if attempt == 1 else f"{name}@{attempt}", tree_id=tree.id if tree else "",
                                depth=depth, timeout_s=run.settings.step_timeout_s)
        value, err = (None, res.error) if res.error else parse(res.text)
        record_call(tree, caller, res, value is not None)
        if value is not None:
            break
        if caller.max_attempts > 1:
            err = f"{caller.backend} {caller.role}, attempt {attempt}/{caller.max_attempts}: {err}"
        await pause(caller, attempt)
    return res, value, err
