"""Who answers a side call (docs/design/roles.md): the rubric writer, the scorer and the best-of-N selector as the
launchers see them, and what each role spent, per tree.

A ``RoleCaller`` names a role and its backend and holds what plays it:

* ``policy`` — the tree's own generator and tokenizer (the trainable policy): the reference's default, one attempt
  per call (docs/design/algorithm.md §3.5: a policy call is never retried);
* ``frozen`` — an engine over a frozen copy of the starting policy (``agents.judge.frozen_policy_engine``), one
  attempt;
* ``endpoint`` — a served model behind the ``sampling.endpoint.EndpointPolicy`` generator (the one HTTP client):
  ``max_attempts`` per call, an invalid reply retried like a failed request, after ``backoff_s × 2^(k-1)`` seconds
  (at most 30), as the reference's external rubric client does;
* ``file`` — the rubric writer only: a fixed, validated rubric (``global_rubric``), no call at all.

Spend: every side call adds to ``tree.misc["role_spend"]["<role>/<backend>"]`` its ``calls`` (requests sent, every
attempt), ``prompt_tokens`` and ``completion_tokens`` (the server's ``usage`` when it reports one, else the token ids
sent and received) and ``failures`` (attempts without a usable reply); ``training.stats`` sums them into
``roles/<role>/<backend>/…`` step metrics, with the actor's turns and the judge's labels counted from the records.
Only tokens of the ``policy`` backend may become datums: each recorded call's turn carries ``misc["backend"]``, and
``rl.datums`` trains a rubric turn only when it is the policy's.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
from pathlib import Path
from typing import Any

from sera_jax.agents.env_name import EnvName
from sera_jax.agents.rubric import parse_rubric

SPEND_KEY = "role_spend"            # tree.misc: {"<role>/<backend>": {calls, prompt_tokens, completion_tokens, failures}}
SPEND_FIELDS = ("calls", "prompt_tokens", "completion_tokens", "failures")
MAX_BACKOFF_S = 30.0                # the reference's external client: min(2^attempt, 30) s between attempts
RUBRIC_DIR = Path(__file__).resolve().parents[1] / "assets" / "rubrics"   # the shipped global rubrics: <env>.json


@dataclasses.dataclass
class RoleCaller:
    """One role's player (see the module docstring). ``generator`` / ``tokenizer`` None: the tree's own."""

    role: str
    backend: str = "policy"
    generator: Any = None
    tokenizer: Any = None
    rubric: dict | None = None       # backend file: the fixed rubric, already validated
    max_attempts: int = 1
    backoff_s: float = 1.0

    def __post_init__(self) -> None:
        if self.backend not in ("policy", "frozen", "endpoint", "file"):
            raise ValueError(f"unknown backend {self.backend!r} for the {self.role}")
        if self.backend == "file" and self.rubric is None:
            raise ValueError("a file-backed rubric writer needs its rubric")
        if self.backend in ("frozen", "endpoint") and (self.generator is None or self.tokenizer is None):
            raise ValueError(f"the {self.role} on backend {self.backend} needs a generator and a tokenizer")
        if self.max_attempts < 1:
            raise ValueError("max_attempts must be ≥ 1")

    @property
    def key(self) -> str:
        return f"{self.role}/{self.backend}"

    def plays(self, run: Any) -> tuple[Any, Any]:
        """Returns (generator, tokenizer) that answer this role's calls for the tree ``run`` is running."""
        return (self.generator or run.generator), (self.tokenizer or run.tokenizer)

    def backoff(self, attempt: int) -> float:
        """Returns the wait before attempt ``attempt + 1`` (attempt counted from 1)."""
        return min(self.backoff_s * 2 ** (attempt - 1), MAX_BACKOFF_S)


@dataclasses.dataclass
class RoleCallers:
    """The side-call roles a launcher uses: rubric writer, scorer, and the selector's oracle judge (None: the
    selector picks by the rubric's scores)."""

    rubric_writer: RoleCaller = dataclasses.field(default_factory=lambda: RoleCaller("rubric_writer"))
    scorer: RoleCaller = dataclasses.field(default_factory=lambda: RoleCaller("scorer"))
    selector_judge: Any = None

    def describe(self) -> dict[str, str]:
        """Returns role → backend, as trees record it."""
        return {"rubric_writer": self.rubric_writer.backend, "scorer": self.scorer.backend,
                "selector": "endpoint" if self.selector_judge is not None else "policy"}


POLICY_ROLES = RoleCallers()


def empty_spend() -> dict[str, int]:
    return dict.fromkeys(SPEND_FIELDS, 0)


def add_spend(tree: Any, key: str, *, calls: int = 0, prompt_tokens: int = 0, completion_tokens: int = 0,
              failures: int = 0) -> None:
    """Adds one call's spend to ``tree.misc["role_spend"][key]`` (nothing when ``tree`` is None)."""
    if tree is None:
        return
    rec = tree.misc.setdefault(SPEND_KEY, {}).setdefault(key, empty_spend())
    rec["calls"] += int(calls)
    rec["prompt_tokens"] += int(prompt_tokens)
    rec["completion_tokens"] += int(completion_tokens)
    rec["failures"] += int(failures)


def call_tokens(turn: Any) -> tuple[int, int]:
    """Returns (prompt, completion) tokens of a recorded side call: the server's usage when metered, else the ids."""
    if turn is None:
        return 0, 0
    usage = turn.misc.get("usage") or {}
    if usage.get("metered") and "prompt_tokens" in usage:
        return int(usage["prompt_tokens"]), int(usage["completion_tokens"])
    return len(turn.prompt_ids), len(turn.completion_ids)


def record_call(tree: Any, caller: RoleCaller, result: Any, ok: bool) -> None:
    """Counts one attempt of ``caller`` (a ``policy_call.CallResult``) and tags its turn with the backend."""
    if result.turn is not None:
        result.turn.misc["backend"] = caller.backend
        result.turn.misc["role"] = caller.role
    p, c = call_tokens(result.turn)
    add_spend(tree, caller.key, calls=1, prompt_tokens=p, completion_tokens=c, failures=0 if ok else 1)


def global_rubric_path(env: EnvName) -> Path:
    """Returns the path of the shipped global sub-agent rubric of ``env``."""
    return RUBRIC_DIR / f"{env}.json"


def load_rubric_file(path: str | Path, min_items: int = 2) -> dict:
    """Returns the validated rubric in ``path`` (read by the same parser as a generated rubric); raises ValueError
    naming the file and why it is not a valid rubric."""
    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8")
    except OSError as e:
        raise ValueError(f"rubric file {p}: {e.strerror or e}") from None
    rubric, err = parse_rubric(text, min_items)
    if rubric is None:
        raise ValueError(f"rubric file {p} is not a valid rubric: {err}")
    return rubric


def global_rubric(env: EnvName, min_items: int = 2) -> dict:
    """Returns ``env``'s shipped global rubric, validated."""
    return load_rubric_file(global_rubric_path(env), min_items)


def rubric_json(rubric: dict) -> str:
    """Returns a rubric as the JSON text a model would have written (for records)."""
    return json.dumps(rubric, sort_keys=True, ensure_ascii=False)


async def pause(caller: RoleCaller, attempt: int) -> None:
    """Waits before the next attempt of ``caller`` (none after the last)."""
    if attempt < caller.max_attempts:
        await asyncio.sleep(caller.backoff(attempt))
