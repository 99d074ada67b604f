"""Context truncation of agent prompts (sera_algorithm.md §1.3).

When a rendered prompt is longer than ``max_prompt_tokens``:
1. keep message 0 (system) and message 1 (the task message) and delete the oldest remaining (assistant, user) pair
   of the history, re-encoding after each deletion, until it fits or fewer than two history messages remain;
2. if it still does not fit, send the head of messages 0–1 (encoded without the generation prompt) cut to the cap,
   followed by the last ``cap − len(head)`` tokens of the full generation-prompted encoding.

The caller keeps the *post-deletion* message list for the agent's next turns (the deleted pairs stay deleted), and
records exactly the ids that were sent.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Mapping, Sequence

Message = Mapping[str, Any]


@dataclasses.dataclass(frozen=True)
class Prompt:
    """A prompt as sent: ``ids`` (≤ the cap), ``messages`` (the post-deletion list to keep), how many history pairs
    were deleted, whether the head + tail cut was applied, and the encoded length before any truncation."""

    ids: list[int]
    messages: list[dict]
    dropped_pairs: int = 0
    head_tail: bool = False
    full_len: int = 0

    def info(self) -> dict:
        """Returns the truncation facts worth recording on a turn."""
        return {"prompt_full_len": self.full_len, "dropped_pairs": self.dropped_pairs, "head_tail": self.head_tail}


def build_prompt(tokenizer: Any, messages: Sequence[Message], max_prompt_tokens: int) -> Prompt:
    """Returns the Prompt of ``messages`` under the §1.3 rule (``tokenizer.encode_chat`` renders ChatML)."""
    msgs = [dict(m) for m in messages]
    ids = tokenizer.encode_chat(msgs, add_generation_prompt=True)
    full_len = len(ids)
    if full_len <= max_prompt_tokens:
        return Prompt(ids, msgs, 0, False, full_len)
    dropped = 0
    while len(ids) > max_prompt_tokens and len(msgs) - 2 >= 2:
        del msgs[2:4]  # the oldest (assistant, user) pair after system + task
        dropped += 1
        ids = tokenizer.encode_chat(msgs, add_generation_prompt=True)
    if len(ids) <= max_prompt_tokens:
        return Prompt(ids, msgs, dropped, False, full_len)
    head = tokenizer.encode_chat(msgs[:2], add_generation_prompt=False)[:max_prompt_tokens]
    tail = max_prompt_tokens - len(head)
    sent = head + (ids[-tail:] if tail > 0 else [])
    return Prompt(sent, msgs, dropped, True, full_len)
