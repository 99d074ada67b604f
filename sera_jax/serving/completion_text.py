"""A completion's text as a client sees it: special tokens left out, cut before the first stop string (the OpenAI
convention: the stop sequence is not returned), and, while streaming, only the part that can no longer change."""

from __future__ import annotations

from typing import Any, Sequence

REPLACEMENT = "\ufffd"  # what a decoder shows for the first bytes of a character whose last bytes are still to come


def cut_at_stop(text: str, stops: Sequence[str]) -> tuple[str, bool]:
    """Returns (``text`` up to its earliest stop string, whether one was found)."""
    cut = min((i for i in (text.find(s) for s in stops if s) if i >= 0), default=-1)
    return (text[:cut], True) if cut >= 0 else (text, False)


def final_text(tokenizer: Any, token_ids: Sequence[int], stops: Sequence[str]) -> str:
    """Returns the client-visible text of a finished completion."""
    return cut_at_stop(tokenizer.decode(list(token_ids), skip_special_tokens=True), stops)[0]


def stable_prefix(tokenizer: Any, token_ids: Sequence[int], stops: Sequence[str]) -> str:
    """Returns the part of a running completion's text that later tokens cannot change: without a trailing partial
    character, and (when there are stop strings) without the last ``len(longest stop) - 1`` characters, which may be
    the start of a stop string that the next token completes."""
    text, found = cut_at_stop(tokenizer.decode(list(token_ids), skip_special_tokens=True), stops)
    if found:
        return text
    text = text.rstrip(REPLACEMENT)
    hold = max((len(s) for s in stops), default=1) - 1
    return text[:len(text) - hold] if hold > 0 else text
