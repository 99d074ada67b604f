"""Builders for small tokenizers shaped like the ones sera-jax loads (no model hub is reachable from tests).

``build_qwen_like_tokenizer(dir)`` trains a byte-level BPE with the `tokenizers` library and lays it out the way a
Qwen3-Instruct checkpoint does: tokenizer.json whose added tokens follow the BPE vocabulary (<|endoftext|> first,
then <|im_start|>, <|im_end|> and a few more of Qwen's), plus tokenizer_config.json naming eos/pad and carrying a
ChatML jinja chat_template, so transformers' AutoTokenizer can load the same directory.

``build_tiny_spm(path)`` trains a tiny sentencepiece model with the ChatML symbols as user-defined symbols.
"""

from __future__ import annotations

import json
from pathlib import Path

from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers
from tokenizers import AddedToken

# Special added tokens, in Qwen's order: <|endoftext|> gets the first id after the BPE vocabulary.
QWEN_SPECIAL = [
    "<|endoftext|>", "<|im_start|>", "<|im_end|>",
    "<|object_ref_start|>", "<|object_ref_end|>", "<|vision_start|>", "<|vision_end|>", "<|vision_pad|>",
]
# Added but not special (Qwen has these too): kept by decode(skip_special_tokens=True).
QWEN_NONSPECIAL = ["<tool_call>", "</tool_call>", "<think>", "</think>"]

# ChatML, written for these tests: one block per message, then the generation prompt when asked.
CHATML_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)

CORPUS = [
    "You are a helpful assistant that solves crafting tasks step by step.",
    "Craft 4 oak planks from 1 oak log, then make a crafting table.",
    "def solve(inventory):\n    for item, count in inventory.items():\n"
    "        print(f\"{item}: {count}\")\n    return True\n",
    "if x > 0:\n\treturn x * 2  # double it\nelse:\n\treturn -x\n",
    "The quick brown fox jumps over the lazy dog. 0123456789 + - * / = < > ( ) [ ] { }",
    "Ünïcödé text: café, naïve, façade, 日本語のテキスト, 中文字符, русский текст, emoji 🙂🚀.",
    "look around\ngo north\ntake key from table\nopen door with key\n",
    "Observation: You see a chest. The chest is locked.\nAction: unlock chest with key\n",
    "launch_subagent(task='collect 3 iron ingots', rubric='1 point per ingot')",
] * 4


def build_qwen_like_tokenizer(out_dir: Path, bpe_vocab_size: int = 600) -> Path:
    """Writes tokenizer.json + tokenizer_config.json into ``out_dir`` and returns ``out_dir``."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    tok = Tokenizer(models.BPE())
    tok.normalizer = normalizers.NFC()
    # Split words, single digits, punctuation runs and whitespace, then map bytes to the byte-level alphabet.
    split = Regex(r" ?\p{L}+| ?\p{N}| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+")
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(split, behavior="isolated"),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
    ])
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=bpe_vocab_size, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False,
    )
    tok.train_from_iterator(CORPUS, trainer=trainer)
    bpe_size = tok.get_vocab_size()
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in QWEN_SPECIAL])
    tok.add_tokens([AddedToken(t, special=False, normalized=False) for t in QWEN_NONSPECIAL])
    assert tok.token_to_id("<|endoftext|>") == bpe_size
    tok.save(str(out_dir / "tokenizer.json"))
    config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "eos_token": "<|im_end|>",
        "pad_token": "<|endoftext|>",
        "bos_token": None,
        "unk_token": None,
        "clean_up_tokenization_spaces": False,
        "model_max_length": 262144,
        "chat_template": CHATML_TEMPLATE,
    }
    (out_dir / "tokenizer_config.json").write_text(json.dumps(config, indent=2))
    return out_dir


def build_tiny_spm(model_path: Path, vocab_size: int = 420) -> Path:
    """Trains a tiny sentencepiece model with ChatML user-defined symbols; returns the .model path."""
    from sera_jax.model.tokenizer import train_sentencepiece

    return train_sentencepiece(CORPUS, model_path, vocab_size)
