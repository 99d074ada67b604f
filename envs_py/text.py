"""Text that crosses from a sandbox or a world into the runtime is data: always valid UTF-8, repairs marked.

A cell can build any Python ``str``, and the wire (JSON with ``\\ud800`` escapes, pickle) carries it as it is,
lone surrogates included. Such a string cannot be encoded as UTF-8: the tokenizer, the records writer and any
``.encode()`` would raise on it. So every string that reaches the runtime from an env worker (cell output, errors,
finish messages, tool values echoed back, observations, sub-agent requests) and every goal parsed out of a reply's
JSON passes through :func:`valid_text` / :func:`valid_tree` once, at that boundary.

The repair: each surrogate code point (U+D800–U+DFFF, paired or not: a Python ``str`` holds code points, and a
surrogate is never one UTF-8 can carry) becomes U+FFFD REPLACEMENT CHARACTER, the visible marker that text was
repaired there. Every other character is kept as it is, so valid text comes back unchanged (the same object).
"""

from __future__ import annotations

import dataclasses
import re
from typing import Any

REPLACEMENT = "\ufffd"
_SURROGATE = re.compile("[\ud800-\udfff]")


def valid_text(text: str) -> str:
    """Returns ``text`` with every surrogate code point replaced by U+FFFD: a ``str`` that encodes as UTF-8.

    Valid text is returned unchanged (the same object); a ``str`` subclass comes back as a plain ``str``.
    """
    if _SURROGATE.search(text) is None:
        return text if type(text) is str else str.__str__(text)
    return _SURROGATE.sub(REPLACEMENT, text)


def valid_tree(obj: Any) -> Any:
    """Returns ``obj`` with :func:`valid_text` applied to every string in it: dict keys and values, list, tuple and
    set items, and the fields of dataclass instances, recursively. Other values are kept; a container or dataclass
    whose strings were all valid is returned unchanged (the same object)."""
    if isinstance(obj, str):
        return valid_text(obj)
    if isinstance(obj, dict):
        items = [(valid_tree(k), valid_tree(v)) for k, v in obj.items()]
        if all(k is k0 and v is v0 for (k, v), (k0, v0) in zip(items, obj.items())):
            return obj
        return dict(items)
    if isinstance(obj, (list, tuple, set, frozenset)):
        items = [valid_tree(x) for x in obj]
        if all(x is x0 for x, x0 in zip(items, obj)):
            return obj
        if isinstance(obj, tuple) and hasattr(obj, "_fields"):  # a named tuple
            return type(obj)(*items)
        return type(obj)(items)
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        changes = {}
        for f in dataclasses.fields(obj):
            if not f.init:
                continue
            value = getattr(obj, f.name)
            clean = valid_tree(value)
            if clean is not value:
                changes[f.name] = clean
        return dataclasses.replace(obj, **changes) if changes else obj
    return obj
