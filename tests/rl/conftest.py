"""Shared fixtures for the credit-assignment tests: a real byte-level BPE tokenizer and record builders."""

from __future__ import annotations

import pytest
from tokenizers import ByteLevelBPETokenizer


_CORPUS = [
    '<thought>I need 4 sticks, so I delegate.</thought>\n<python>r = await launch_subagent({"stick": 4}, '
    '"use planks")\nprint(r)</python>',
    '<python>craft({"oak_planks": 1}, ("stick", 4))\nprint(view_inventory())</python>',
    '<python>results = await asyncio.gather(launch_subagent({"a": 1}), launch_subagent({"b": 2}))</python>',
    'get_info(["oak_log"])\nfinish("done")\nfor t in targets:\n    x = await launch_subagent(t)\n',
    '<delegate goal="open the chest">take key, unlock chest</delegate> é ü 🌲 naïve café',
]


@pytest.fixture(scope="session")
def bpe():
    """A small byte-level BPE (the same model family as Qwen's tokenizer), trained here so no download is
    needed. Its decoded pieces are real: merges split identifiers and multi-byte characters across tokens."""
    tok = ByteLevelBPETokenizer()
    tok.train_from_iterator(_CORPUS * 20, vocab_size=420, min_frequency=2, special_tokens=["<|im_end|>"],
                            show_progress=False)
    return tok


@pytest.fixture(scope="session")
def decode(bpe):
    return lambda ids: bpe.decode(list(ids), skip_special_tokens=False)
