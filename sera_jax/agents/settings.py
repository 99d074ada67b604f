"""Runtime settings of the recursive agent runtime: budgets, depth, prompt/completion caps, sampling, scheduling.

``RuntimeSettings.for_env(env, evaluation=...)`` gives the spec's defaults per environment (docs/design/algorithm.md
§1.1–1.3, §8–9; docs/design/textworld.md §10–12); every field can be overridden. The settings object is frozen and
hashable so it can be shared by every tree of a run.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from sera_jax.agents.env_name import DEFAULT_ENV, EnvName
from sera_jax.agents.environments import environment
from sera_jax.sampling.types import SamplingParams

STUCK_MESSAGE = "Stuck in a loop, terminating early."
EXHAUSTED_MESSAGE = "WARNING: Exhausted budget when running episode. Halting episode; task may be incomplete."


@dataclasses.dataclass(frozen=True)
class RuntimeSettings:
    """How one tree runs.

    max_steps: own turns per agent (root and every sub-agent; a child's turns never charge its parent).
    max_depth: deepest agent depth (root 0); a launch from this depth is refused.
    max_prompt_tokens: the §1.3 truncation cap on the prompt as sent; max_context: the serving context
    (prompt + completion), used to shrink max_new_tokens when a prompt is near the cap.
    temperature / top_p / max_new_tokens / stop_strings: per-turn sampling (stop ids come from the tokenizer).
    loop_threshold / loop_max_period: the loop breaker (last threshold·p cells repeat a period-p pattern, p ≤ max).
    deterministic: agents of one tree touch the world in a fixed order, so a tree replays exactly from its seed:
    siblings of one delegate block run in lockstep ticks (all observe, generate together, act in launch order);
    separate launch_subagent calls of one TextCraft cell run one after another in call order. Otherwise siblings
    run freely concurrently on the shared world.
    seed / policy_version: folded into every turn's PRNG key (with task, rollout index, node path and turn).
    step_timeout_s: limit on one generation call; tree_timeout_s: limit on the whole tree (then its agents are
    recorded with the rollout error and zero reward).
    sandbox_spares: pre-started TextCraft sandboxes per env worker (0 = start one per agent on demand).
    cell_limits: per-cell sandbox limits (``envs_py.sandbox.Limits``; None = the sandbox defaults).
    subagents_enabled: TextWorld may hide delegation entirely (the flat variant).
    prompt_style: "paper" (the spec's prompt texts) or "compact" (TextCraft: the same game, tools, format and
    rubric/score protocol in a few lines, for the tiny CPU default; see ``codeact_prompt`` and ``rubric``).
    token_history: an agent's next prompt extends its last prompt with the completion's sampled tokens
    (``truncation.continue_prompt``) instead of re-encoding the conversation (the reference's rule; False).
    """

    env: EnvName = DEFAULT_ENV
    max_steps: int = 20
    max_depth: int = 3
    max_prompt_tokens: int = 9600
    max_context: int = 10240
    max_new_tokens: int = 512
    temperature: float = 1.0
    top_p: float = 1.0
    stop_strings: tuple[str, ...] = ("</python>",)
    loop_threshold: int = 4
    loop_max_period: int = 3
    deterministic: bool = False
    seed: int = 0
    policy_version: int = 0
    step_timeout_s: float = 1800.0
    tree_timeout_s: float = 3600.0
    sandbox_spares: int = 0
    cell_limits: Any = None
    subagents_enabled: bool = True
    prompt_style: str = "paper"
    token_history: bool = False

    def __post_init__(self) -> None:
        environment(self.env)  # raises ValueError naming the registered environments
        for name in ("max_steps", "max_prompt_tokens", "max_context", "max_new_tokens", "loop_threshold"):
            if getattr(self, name) <= 0:
                raise ValueError(f"{name} must be positive, got {getattr(self, name)}")
        if self.prompt_style not in ("paper", "compact"):
            raise ValueError(f"prompt_style must be 'paper' or 'compact', got {self.prompt_style!r}")
        if self.max_depth < 0:
            raise ValueError(f"max_depth must be ≥ 0, got {self.max_depth}")
        if self.max_prompt_tokens >= self.max_context:
            raise ValueError(f"max_prompt_tokens ({self.max_prompt_tokens}) must leave room in max_context "
                             f"({self.max_context}) for a completion")

    @classmethod
    def for_env(cls, env: EnvName, *, evaluation: bool = False, **overrides) -> "RuntimeSettings":
        """Returns the spec defaults of the registered environment ``env`` (its ``runtime_defaults``) for training
        or evaluation (temperature 0 and the evaluation prompt cap), with ``overrides`` applied."""
        base = dict(env=env, **environment(env).runtime_defaults(evaluation))
        base["temperature"] = 0.0 if evaluation else 1.0
        base.update(overrides)
        return cls(**base)

    def sampling(self, stop_ids: tuple[int, ...], prompt_len: int) -> SamplingParams:
        """Returns the SamplingParams of one turn whose prompt has ``prompt_len`` tokens (the completion cap
        shrinks so prompt + completion fit ``max_context``). Raises ValueError when no token fits."""
        room = self.max_context - prompt_len
        if room <= 0:
            raise ValueError(f"prompt of {prompt_len} tokens leaves no room in the {self.max_context}-token context")
        return SamplingParams(max_new_tokens=min(self.max_new_tokens, room), temperature=self.temperature,
                              top_p=self.top_p, stop_ids=tuple(stop_ids), stop_strings=tuple(self.stop_strings))
