"""Context truncation of agent prompts (docs/design/algorithm.md §1.3).

When a rendered prompt is longer than ``max_prompt_tokens``:
1. keep message 0 (system) and message 1 (the task message) and delete the oldest remaining (assistant, user) pair
   of the history, re-encoding after each deletion, until it fits or fewer than two history messages remain;
2. if it still does not fit, send the head of messages 0–1 (encoded without the generation prompt) cut to the cap,
   followed by the last ``cap − len(head)`` tokens of the full generation-prompted encoding.

The caller keeps the *post-deletion* message list for the agent's next turns (the deleted pairs stay deleted), and
records exactly the ids that were sent.

``continue_prompt`` is the token-level alternative (``RuntimeSettings.token_history``): the next prompt is the last
prompt's ids, the completion's ids exactly as sampled, and the encoding of the messages that follow — instead of
re-encoding the whole conversation. Re-encoding (the reference's rule) can tokenize the history differently from how
it was sampled: a sampled non-canonical segmentation, or a piece merging across the generation prompt's last newline
(the tiny sentencepiece tokenizer did both, so each turn of the tiny policy re-prefilled ~200 history tokens and its
turns never merged into one datum). The continuation keeps every turn's prompt an exact prefix of the next one.
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
    continued: bool = False  # built by continue_prompt (token history), not by encoding the messages

    def info(self) -> dict:
        """Returns the truncation facts worth recording on a turn."""
        return {"prompt_full_len": self.full_len, "dropped_pairs": self.dropped_pairs, "head_tail": self.head_tail,
                "token_history": self.continued}


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


def continue_prompt(tokenizer: Any, prev: Prompt, completion_ids: Sequence[int], messages: Sequence[Message],
                    max_prompt_tokens: int) -> Prompt | None:
    """Returns the next prompt as ``prev.ids`` + ``completion_ids`` (+ ``<|im_end|>`` unless the completion ended
    with it) + the encoding of the messages after the assistant reply (with the generation prompt), or None when
    that is not possible and the caller must use :func:`build_prompt`: ``messages`` do not extend
    ``prev.messages`` by one assistant reply and at least one more message, ``prev`` was cut head + tail, the
    completion ended with another stop token, or the result exceeds ``max_prompt_tokens``.

    The assistant message's text is not re-encoded: the history holds the tokens the policy sampled.
    """
    n = len(prev.messages)
    if prev.head_tail or len(messages) < n + 2 or messages[n].get("role") != "assistant":
        return None
    if [dict(m) for m in messages[:n]] != prev.messages:
        return None
    body = [int(t) for t in completion_ids]
    end = tokenizer.im_end_id
    if not body or body[-1] != end:
        if body and body[-1] in tokenizer.stop_ids:
            return None
        body.append(end)
    # The newline after the <|im_end|> is the template's; the messages' contents are plain text (never control tokens).
    tail = tokenizer.encode_chat(messages[n + 1:], add_generation_prompt=True, prefix="\n")
    ids = list(prev.ids) + body + tail
    if len(ids) > max_prompt_tokens:
        return None
    return Prompt(ids, [dict(m) for m in messages], 0, False, len(ids), continued=True)
