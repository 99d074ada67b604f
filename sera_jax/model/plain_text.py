"""Text a tokenizer encodes as plain text: no special-token string in it becomes a control id, and no string makes
the tokenizer raise.

* Hugging Face tokenizers encode plain text with special-token matching off; sentencepiece has no such switch and
  matches its user-defined symbols (the ChatML markers) anywhere, so plain text is cut into fragments, one character
  after each place where such a symbol starts, and the fragments are encoded one by one: ``<|im_end|>`` in an
  observation becomes ordinary pieces. Text without those strings is one fragment, encoded exactly as before.
* A Python ``str`` can hold surrogate code points (a cell can print ``'\\ud800'``); no UTF-8 tokenizer takes them
  (the Rust and C++ bindings raise). :func:`valid_text` replaces each with U+FFFD, the rule and the marker of
  ``envs_py.text.valid_text`` at the runtime's boundary, repeated here because the model room imports no
  environment code.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from typing import Any

_SURROGATE = re.compile("[\\ud800-\\udfff]")


def user_defined_symbols(sp: Any, fallback: Sequence[str]) -> list[str]:
    """Returns the user-defined pieces of a loaded sentencepiece model, read from its proto (``fallback`` when it has
    none, or when protobuf, which the proto reader needs, is not installed)."""
    try:
        from sentencepiece import sentencepiece_model_pb2
    except ImportError:  # protobuf missing
        return list(fallback)
    proto = sentencepiece_model_pb2.ModelProto()
    proto.ParseFromString(sp.serialized_model_proto())
    user_defined = sentencepiece_model_pb2.ModelProto.SentencePiece.USER_DEFINED
    return [p.piece for p in proto.pieces if p.type == user_defined] or list(fallback)


def breaks_pattern(strings: Iterable[str]) -> re.Pattern | None:
    """Returns a pattern matching (zero-width) where any of ``strings`` starts, or None when there is none to break.
    A string of one character cannot be broken and is left out."""
    strings = sorted({t for t in strings if len(t) > 1}, key=len, reverse=True)
    return re.compile("(?=(?:" + "|".join(map(re.escape, strings)) + "))") if strings else None


def fragments(text: str, breaks: re.Pattern | None) -> list[str]:
    """Returns ``text`` cut one character after every position where a break string starts (overlapping ones
    included): no fragment holds a whole break string, since each is at least two characters long."""
    cuts = [m.start() + 1 for m in breaks.finditer(text)] if breaks is not None else []
    if not cuts:
        return [text]
    bounds = [0, *cuts, len(text)]
    return [text[a:b] for a, b in zip(bounds, bounds[1:]) if a < b]


def encode_fragments(texts: Sequence[str], breaks: re.Pattern | None, encode: Any) -> list[list[int]]:
    """Returns, per text, the concatenated ids of its fragments, all encoded by one call of ``encode`` (a batch
    encoder: list of str -> list of id lists)."""
    parts = [fragments(t, breaks) for t in texts]
    flat = encode([f for p in parts for f in p])
    out, k = [], 0
    for p in parts:
        ids: list[int] = []
        for ids_f in flat[k:k + len(p)]:
            ids.extend(ids_f)
        out.append(ids)
        k += len(p)
    return out


def valid_text(text: str) -> str:
    """Returns ``text`` with every surrogate code point replaced by U+FFFD (``envs_py.text.valid_text``'s rule): text
    a UTF-8 tokenizer can take. Valid text comes back unchanged."""
    return text if _SURROGATE.search(text) is None else _SURROGATE.sub("\ufffd", text)
