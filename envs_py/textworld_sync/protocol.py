"""The reply protocol of TextWorld-Sync agents (docs/design/textworld.md §10.1): one action, delegate or finish block per reply.

`parse_reply(text)` never raises: anything malformed becomes kind "invalid" with a clear error text and the
best-effort fallback command the reference runner would send to the world (which costs that agent a turn and,
when sent, a global step). A delegated goal is text the policy wrote: JSON escapes can put lone surrogates in it, so
it is made valid UTF-8 (``envs_py.text.valid_text``) before it becomes a child's task.
"""

from __future__ import annotations

import dataclasses
import json
import re

from envs_py.text import valid_text

DEFAULT_MAX_STEPS = 20
INVENTORY_FORMS = frozenset({"inventory", "view inventory", "check inventory"})
KINDS = ("action", "delegate", "finish")
_BLOCKS = {
    kind: re.compile(rf"<\s*{kind}\s*>(.*?)<\s*/\s*{kind}\s*>", re.IGNORECASE | re.DOTALL) for kind in KINDS
}
_FENCE = re.compile(r"```[^\n`]*\n(.*?)```", re.DOTALL)
_PREFIX = re.compile(r"^\s*(action|command)\s*:\s*", re.IGNORECASE)
FORMAT_HINT = (
    "Reply with exactly one block: <action>COMMAND</action>, <action>inventory</action>, "
    '<delegate>{"goal": "...", "max_steps": N}</delegate> or <finish>MESSAGE</finish>.'
)


@dataclasses.dataclass(frozen=True)
class Delegation:
    """One requested sub-agent: its goal text and its requested turn budget."""

    goal: str
    max_steps: int = DEFAULT_MAX_STEPS


@dataclasses.dataclass(frozen=True)
class Reply:
    """A parsed reply. kind: action | inventory | delegate | finish | invalid."""

    kind: str
    command: str = ""
    message: str = ""
    delegations: tuple[Delegation, ...] = ()
    error: str = ""
    fallback: str = ""

    @property
    def fallback_is_inventory(self) -> bool:
        """True when an invalid reply's fallback command is an inventory look-up (free, no world step)."""
        return is_inventory_command(self.fallback)


def normalize_command(command: str) -> str:
    """Returns the command lower-cased with whitespace collapsed."""
    return " ".join(str(command).lower().split())


def is_inventory_command(command: str) -> bool:
    """Returns True iff the command is an inventory look-up (`inventory`, `view inventory`, `check inventory`)."""
    return normalize_command(command) in INVENTORY_FORMS


def parse_reply(text: object) -> Reply:
    """Returns the Reply parsed from one model response; malformed input gives kind 'invalid' with an error text."""
    try:
        return _parse(valid_text(str(text)) if text is not None else "")
    except Exception as exc:  # noqa: BLE001  (untrusted input must never crash the runner)
        return Reply(kind="invalid", error=f"Invalid response: could not be parsed ({type(exc).__name__}). "
                                           + FORMAT_HINT)


def _invalid(text: str, reason: str) -> Reply:
    return Reply(kind="invalid", error=f"Invalid response: {reason}. {FORMAT_HINT}", fallback=fallback_command(text))


def _parse(text: str) -> Reply:
    found = {kind: [m.group(1).strip() for m in pattern.finditer(text)] for kind, pattern in _BLOCKS.items()}
    present = [kind for kind in KINDS if found[kind]]
    if len(present) != 1:
        which = ", ".join(present) if present else "none"
        return _invalid(text, f"response must contain exactly one action, delegate, or finish block (found: {which})")
    kind = present[0]
    content = found[kind][0]  # several blocks of one kind: the first is used
    if kind == "action":
        if not content:
            return _invalid(text, "the action block is empty")
        if is_inventory_command(content):
            return Reply(kind="inventory", command=normalize_command(content))
        return Reply(kind="action", command=content)
    if kind == "finish":
        if not content:
            return _invalid(text, "the finish block is empty")
        return Reply(kind="finish", message=content)
    return _parse_delegate(text, content)


def _parse_delegate(text: str, content: str) -> Reply:
    try:
        data = json.loads(content)
    except (json.JSONDecodeError, ValueError, RecursionError) as exc:
        return _invalid(text, f"the delegate block is not valid JSON ({exc.__class__.__name__}: {exc})")
    if not isinstance(data, dict):
        return _invalid(text, "the delegate block must be a JSON object")
    if "delegations" in data:
        items = data["delegations"]
        if not isinstance(items, list) or not items:
            return _invalid(text, "'delegations' must be a non-empty list of {\"goal\": ...} objects")
    else:
        items = [data]
    out = []
    for n, item in enumerate(items):
        where = f"delegation {n}" if "delegations" in data else "the delegation"
        if not isinstance(item, dict):
            return _invalid(text, f"{where} must be a JSON object")
        goal = item.get("goal")
        if not isinstance(goal, str) or not goal.strip():
            return _invalid(text, f"{where} needs a non-empty string 'goal'")
        goal = valid_text(goal)  # JSON's \ud800 escapes make lone surrogates: the child's prompt must encode
        steps = item.get("max_steps", DEFAULT_MAX_STEPS)
        if steps is None:
            steps = DEFAULT_MAX_STEPS
        if isinstance(steps, bool) or not isinstance(steps, int) or steps <= 0:
            return _invalid(text, f"{where} has max_steps {steps!r}; it must be a positive integer")
        out.append(Delegation(goal=goal.strip(), max_steps=steps))
    return Reply(kind="delegate", delegations=tuple(out))


def fallback_command(text: str) -> str:
    """Returns the best-effort command of an invalid reply (docs/design/textworld.md §10.1): the first non-empty <action> content;
    else the last line of the first fenced code block; else the last non-empty line with a leading
    'action:'/'command:' and surrounding quotes/backticks removed. Empty when the reply has no text."""
    for match in _BLOCKS["action"].finditer(text):
        if match.group(1).strip():
            return match.group(1).strip()
    fence = _FENCE.search(text)
    if fence:
        lines = [line.strip() for line in fence.group(1).splitlines() if line.strip()]
        if lines:
            return lines[-1]
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    if not lines:
        return ""
    return _PREFIX.sub("", lines[-1]).strip().strip("\"'`").strip()
