"""Where a completion launched sub-agents: character spans of the launch statements and their tokens (docs/design/algorithm.md §2.2).

The delegation objective trains only the tokens that wrote the launch, so three steps are kept apart here:
1. ``launch_statement_spans(code)`` — TextCraft: the statements enclosing each ``launch_subagent`` call, found with
   the Python AST; ``delegate_block_spans(text)`` — TextWorld: each ``<delegate …>…</delegate>`` block.
2. ``place_spans(code, spans, completion_text)`` — move code-relative spans into the decoded completion.
3. ``spans_to_token_mask(spans, prefix_lengths)`` — the §2.2 character→token rule on decoded prefix lengths,
   which ``decoded_prefix_lengths(ids, decode)`` computes with the real tokenizer's decode.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Callable, Sequence

from sera_jax.agents.env_name import DEFAULT_ENV, EnvName
from sera_jax.agents.environments import environment

__all__ = [
    "launch_statement_spans", "delegate_block_spans", "place_spans", "decoded_prefix_lengths",
    "spans_to_token_mask", "launch_token_mask",
]

Span = tuple[int, int]
_DELEGATE = re.compile(r"<delegate\b.*?(?:</delegate>|\Z)", re.DOTALL)


def _is_launch_call(node: ast.AST) -> bool:
    if not isinstance(node, ast.Call):
        return False
    f = node.func
    return (isinstance(f, ast.Name) and f.id == "launch_subagent") or \
        (isinstance(f, ast.Attribute) and f.attr == "launch_subagent")


def _char_offset(line_starts: list[int], lines_utf8: list[bytes], lineno: int, col_utf8: int) -> int:
    # AST columns count UTF-8 bytes; the mask works on characters of the decoded text.
    return line_starts[lineno - 1] + len(lines_utf8[lineno - 1][:col_utf8].decode("utf-8", errors="replace"))


def launch_statement_spans(code: str) -> list[Span]:
    """Returns the sorted unique [start, end) character spans of the statements that call ``launch_subagent``.

    Code that does not parse but mentions ``launch_subagent`` yields the whole string; code without a call
    (a mere mention in a string or comment) yields [].
    """
    try:
        tree = ast.parse(code)
    except (SyntaxError, ValueError):
        return [(0, len(code))] if "launch_subagent" in code else []
    parents: dict[ast.AST, ast.AST] = {}
    for node in ast.walk(tree):
        for child in ast.iter_child_nodes(node):
            parents[child] = node
    lines = code.splitlines(keepends=True) or [""]
    starts, pos = [], 0
    for ln in lines:
        starts.append(pos)
        pos += len(ln)
    lines_utf8 = [ln.encode("utf-8") for ln in lines]
    spans: set[Span] = set()
    for node in ast.walk(tree):
        if not _is_launch_call(node):
            continue
        stmt = node
        while not isinstance(stmt, ast.stmt):  # climb to the nearest enclosing statement
            stmt = parents[stmt]
        s = _char_offset(starts, lines_utf8, stmt.lineno, stmt.col_offset)
        e = _char_offset(starts, lines_utf8, stmt.end_lineno, stmt.end_col_offset)
        spans.add((s, e))
    return sorted(spans)


def delegate_block_spans(text: str) -> list[Span]:
    """Returns the [start, end) character spans of the TextWorld ``<delegate …>…</delegate>`` blocks in ``text``
    (an unclosed block runs to the end of the text)."""
    return [(m.start(), m.end()) for m in _DELEGATE.finditer(text)]


def place_spans(code: str, spans: Sequence[Span], completion_text: str) -> list[Span] | None:
    """Returns ``spans`` (relative to ``code``) moved into ``completion_text``, or None when the code is not found.

    Exact ``find`` first; otherwise the stripped code is searched and spans shift by the removed leading
    whitespace (clipped to the stripped code).
    """
    at = completion_text.find(code)
    if at >= 0:
        return [(s + at, e + at) for s, e in spans]
    stripped = code.strip()
    if not stripped:
        return None
    at = completion_text.find(stripped)
    if at < 0:
        return None
    lead = len(code) - len(code.lstrip())
    lo, hi = at, at + len(stripped)
    out = []
    for s, e in spans:
        s2, e2 = max(lo, s - lead + at), min(hi, e - lead + at)
        if e2 > s2:
            out.append((s2, e2))
    return out


def decoded_prefix_lengths(ids: Sequence[int], decode: Callable[[list[int]], str],
                           upto: int | None = None) -> list[int]:
    """Returns [len(decode(ids[:k])) for k = 0..n] (n = ``upto`` or len(ids)): the decoded prefix lengths the
    §2.2 rule is stated on. Decoding whole prefixes (not pieces) is what keeps multi-byte characters that span
    several byte-level tokens right."""
    n = len(ids) if upto is None else min(upto, len(ids))
    return [len(decode(list(ids[:k]))) for k in range(n + 1)]


def spans_to_token_mask(spans: Sequence[Span], prefix_lengths: Sequence[int], num_tokens: int) -> list[int]:
    """Returns a 0/1 mask over ``num_tokens`` tokens marking, for each character span [start, end):
    tokens [k0 − 1, k1) with k0 = smallest k whose decoded prefix length ≥ start + 1 and k1 = smallest k whose
    decoded prefix length ≥ end, at least k0 (docs/design/algorithm.md §2.2). Spans past the decoded text are ignored."""
    mask = [0] * num_tokens
    n = len(prefix_lengths) - 1
    for start, end in spans:
        if end <= start:
            continue
        k0 = next((k for k in range(n + 1) if prefix_lengths[k] >= start + 1), None)
        if k0 is None:
            continue
        t0 = max(k0 - 1, 0)
        k1 = next((k for k in range(n + 1) if prefix_lengths[k] >= end), n)
        t1 = max(k1, t0 + 1)
        for t in range(t0, min(t1, num_tokens)):
            mask[t] = 1
    return mask


def launch_token_mask(code: str, completion_ids: Sequence[int], decode: Callable[[list[int]], str], *,
                      env: EnvName = DEFAULT_ENV) -> list[int]:
    """Returns the launch mask over ``completion_ids`` (all zeros when there is no launch or the code cannot be
    placed in the completion). ``env``: its registration's ``launch_spans`` finds the launches (TextCraft: AST
    statements, TextWorld-Sync: delegate blocks).

    The code is located in ``decode(completion_ids)`` — the same decode the prefix lengths use — rather than in
    any stored text, so spans and token boundaries can never disagree (e.g. over an appended ``</python>``).
    """
    spans = environment(env).get("launch_spans")(code)
    if not spans:
        return [0] * len(completion_ids)
    placed = place_spans(code, spans, decode(list(completion_ids)))
    if not placed:
        return [0] * len(completion_ids)
    # Tokens past the last span's end are never marked, so stop decoding once the prefix covers it.
    last = max(e for _, e in placed)
    lengths = [0]
    for k in range(1, len(completion_ids) + 1):
        lengths.append(len(decode(list(completion_ids[:k]))))
        if lengths[-1] >= last:
            break
    return spans_to_token_mask(placed, lengths, len(completion_ids))
