"""CodeAct cell handling for TextCraft (docs/design/textcraft.md §6.2-§6.3): reply parsing, observation text, the loop guard."""

from __future__ import annotations

import re
from typing import Sequence

_BOTH = re.compile(r"<thought>(.*?)</thought>\n<python>(.*?)</python>", re.DOTALL)
_THOUGHT = re.compile(r"<thought>(.*?)</thought>", re.DOTALL)
_PYTHON = re.compile(r"<python>(.*?)</python>", re.DOTALL)
_ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")
STUCK_MESSAGE = "Stuck in a loop, terminating early."


def parse_reply(text: str) -> tuple[str, str]:
    """Returns (thought, code) of a model reply; ``</python>`` is appended when the stop string cut it off.
    Either part may be empty (empty code becomes the error observation ``No code available to execute.``)."""
    if "</python>" not in text:
        text = text + "</python>"
    m = _BOTH.search(text)
    if m:
        return m.group(1), m.group(2)
    t, p = _THOUGHT.search(text), _PYTHON.search(text)
    return (t.group(1) if t else ""), (p.group(1) if p else "")


def clean_output(output: str) -> str:
    """Returns cell output with ANSI codes removed and a leading ``Out[n]:`` display prefix stripped (SERA's rule)."""
    output = _ANSI.sub("", output)
    if output.startswith("Out["):
        output = output.split(":", 1)[1].lstrip() if ":" in output else output
    return output


def observation_text(cell_index: int, output: str, error: str = "") -> str:
    """Returns the user turn that reports a cell: ``[Cell i Output]``, the output or ``(No output)``, any error."""
    text = f"[Cell {cell_index} Output]\n{clean_output(output) or '(No output)'}"
    if error:
        text += f"\nError: {error}"
    return text + "\n\nProvide your next action."


def is_stuck(codes: Sequence[str], threshold: int = 4, max_period: int = 3) -> bool:
    """Returns whether the last ``threshold * p`` cells repeat one pattern of period p (p = 1..max_period)."""
    stripped = [c.strip() for c in codes]
    for p in range(1, max_period + 1):
        window = stripped[-threshold * p:]
        if len(window) == threshold * p and all(window[i] == window[i % p] for i in range(len(window))):
            return True
    return False


def subagent_result_text(result: str, used: int, max_steps: int, remaining: int) -> str:
    """Returns what ``await launch_subagent(...)`` gives the parent (depth-aware SERA form): the child's result
    (finish message, else error message, else empty) and the budget line."""
    return (f"{result}\n\nBudget used by subagent: {used}/{max_steps} steps. Total remaining budget for the "
            f"current task is {remaining} steps.\n")
