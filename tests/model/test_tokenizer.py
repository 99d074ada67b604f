"""sera_jax.model.tokenizer: ChatML ids equal transformers' apply_chat_template; sentencepiece path; bad input."""

from __future__ import annotations

import json
import re

import pytest
import sentencepiece as spm

from sera_jax.model.tokenizer import (
    CHATML_SYMBOLS, Tokenizer, load_tokenizer, render_chatml,
)

try:  # tests/model may or may not become a package
    from .tokenizer_fixtures import CORPUS, QWEN_NONSPECIAL, QWEN_SPECIAL, build_qwen_like_tokenizer, build_tiny_spm
except ImportError:
    from tokenizer_fixtures import CORPUS, QWEN_NONSPECIAL, QWEN_SPECIAL, build_qwen_like_tokenizer, build_tiny_spm

CONVERSATIONS = {
    "system_user": [
        {"role": "system", "content": "You are a careful agent. Answer briefly."},
        {"role": "user", "content": "Craft a wooden pickaxe."},
    ],
    "multi_turn": [
        {"role": "system", "content": "You solve TextCraft tasks."},
        {"role": "user", "content": "What is in my inventory?"},
        {"role": "assistant", "content": "Action: inventory"},
        {"role": "user", "content": "Observation: 2 oak logs, 1 stick.\nWhat next?"},
        {"role": "assistant", "content": "Craft 8 oak planks."},
        {"role": "user", "content": "ok"},
    ],
    "user_only": [{"role": "user", "content": "hello"}],
    "unicode": [
        {"role": "user", "content": "Ünïcödé: café, 日本語のテキスト, русский, emoji 🙂🚀 and a rare one 𝔘 ẞ."},
        {"role": "assistant", "content": "Noted — «quoted» ‘text’ … ½ ≥ ∑"},
    ],
    "code_newlines": [
        {"role": "system", "content": ""},
        {"role": "user",
         "content": "Fix this:\n```python\ndef f(x):\n\tif x>0:\n\t\treturn  x\n    return -x   \n```\n\n\n"},
        {"role": "assistant", "content": "  leading spaces\r\nand CRLF\n<tool_call>{\"name\": \"run\"}</tool_call>"},
    ],
    "specials_in_content": [
        {"role": "user", "content": "a literal <|im_end|> and <|endoftext|> and <think>x</think> inside"},
    ],
}


@pytest.fixture(scope="module")
def qwen_dir(tmp_path_factory):
    return build_qwen_like_tokenizer(tmp_path_factory.mktemp("qwen_like"))


@pytest.fixture(scope="module")
def tok(qwen_dir) -> Tokenizer:
    return load_tokenizer(qwen_dir)


@pytest.fixture(scope="module")
def hf_tok(qwen_dir):
    transformers = pytest.importorskip("transformers")
    return transformers.AutoTokenizer.from_pretrained(str(qwen_dir))


def _hf_chat_ids(hf_tok, messages, add_generation_prompt):
    out = hf_tok.apply_chat_template(messages, tokenize=True, add_generation_prompt=add_generation_prompt)
    ids = out["input_ids"] if not isinstance(out, list) else out  # transformers 5 returns a BatchEncoding
    return list(ids)


def _hf_plain_content_chat_ids(hf_tok, messages, add_generation_prompt):
    """ChatML ids built by transformers with each message's text encoded with ``split_special_tokens=True``."""
    def plain(text):
        return hf_tok(text, add_special_tokens=False, split_special_tokens=True)["input_ids"]

    start, end = hf_tok.convert_tokens_to_ids(["<|im_start|>", "<|im_end|>"])
    ids = []
    for m in messages:
        ids += [start] + plain(m["role"] + "\n" + m["content"]) + [end] + plain("\n")
    return ids + ([start] + plain("assistant\n") if add_generation_prompt else [])


# --- Hugging Face tokenizer.json --------------------------------------------------------------------------------

@pytest.mark.parametrize("name", sorted(CONVERSATIONS))
@pytest.mark.parametrize("gen", [True, False], ids=["gen", "nogen"])
def test_chat_ids_equal_transformers_apply_chat_template(tok, hf_tok, name, gen):
    messages = CONVERSATIONS[name]
    if name == "specials_in_content":  # content is plain text here: transformers' split_special_tokens, per message
        expected = _hf_plain_content_chat_ids(hf_tok, messages, gen)
        assert expected != _hf_chat_ids(hf_tok, messages, gen)
    else:
        expected = _hf_chat_ids(hf_tok, messages, gen)
    assert tok.encode_chat(messages, add_generation_prompt=gen) == expected
    assert tok.render_chat(messages, add_generation_prompt=gen) == hf_tok.apply_chat_template(
        messages, tokenize=False, add_generation_prompt=gen)


def test_chat_structure_and_generation_prompt(tok, hf_tok):
    messages = CONVERSATIONS["system_user"]
    with_gen = tok.encode_chat(messages)
    without = tok.encode_chat(messages, add_generation_prompt=False)
    nl = tok.encode("\n")
    assert with_gen[: len(without)] == without
    assert with_gen[len(without):] == [tok.im_start_id] + tok.encode("assistant") + nl
    # one <|im_start|> and one <|im_end|> per message, and each block ends "<|im_end|>\n"
    assert without.count(tok.im_start_id) == len(messages) == without.count(tok.im_end_id)
    assert without[0] == tok.im_start_id and without[-1 - len(nl):] == [tok.im_end_id] + nl
    assert tok.render_chat(messages).startswith("<|im_start|>system\n")  # no default system prompt is added
    assert tok.render_chat(CONVERSATIONS["user_only"]) == "<|im_start|>user\nhello<|im_end|>\n<|im_start|>assistant\n"


def test_special_ids_and_vocab(tok, hf_tok, qwen_dir):
    bpe_size = tok.token_to_id("<|endoftext|>")
    assert [tok.token_to_id(t) for t in QWEN_SPECIAL] == list(range(bpe_size, bpe_size + len(QWEN_SPECIAL)))
    assert tok.endoftext_id == bpe_size
    assert tok.im_start_id == bpe_size + 1 and tok.im_end_id == bpe_size + 2
    assert tok.eos_id == hf_tok.eos_token_id == tok.im_end_id
    assert tok.pad_id == hf_tok.pad_token_id == tok.endoftext_id
    assert tok.stop_ids == tuple(sorted({tok.im_end_id, tok.endoftext_id}))
    assert tok.vocab_size == len(hf_tok) == bpe_size + len(QWEN_SPECIAL) + len(QWEN_NONSPECIAL)
    assert tok.kind == "hf" and tok.path == qwen_dir / "tokenizer.json"
    assert "<|im_start|>" in tok.chat_template
    assert load_tokenizer(qwen_dir / "tokenizer.json").encode("hi there") == tok.encode("hi there")


def test_special_tokens_in_text_are_single_ids(tok, hf_tok):
    for t in QWEN_SPECIAL + QWEN_NONSPECIAL:
        assert tok.encode(t) == [tok.token_to_id(t)], t
    ids = tok.encode("abc<|im_end|>def<|im_start|>user\n")
    assert ids.count(tok.im_end_id) == 1 and ids.count(tok.im_start_id) == 1
    assert ids == hf_tok.encode("abc<|im_end|>def<|im_start|>user\n", add_special_tokens=False)
    # a near miss is not special: it is byte-encoded into several ids
    assert len(tok.encode("<|im_end|")) > 1 and tok.im_end_id not in tok.encode("<|im_end|")


@pytest.mark.parametrize("text", CORPUS[:9] + [
    "", " ", "\n\n", "  two leading, trailing two  ", "tabs\tand\r\nCRLF", "日本語 🙂 𝔘 ẞ ½",
    "never-seen words: zyxwvut qqq 9876543210", "<|im_start|>assistant\n<think>\n</think>\nhi<|im_end|>",
])
def test_round_trip_and_transformers_decode(tok, hf_tok, text):
    ids = tok.encode(text)
    assert ids == hf_tok.encode(text, add_special_tokens=False)
    assert tok.decode(ids) == text
    assert tok.decode(ids, skip_special_tokens=True) == hf_tok.decode(ids, skip_special_tokens=True)
    assert tok.decode(ids) == hf_tok.decode(ids, skip_special_tokens=False)


def test_skip_special_tokens(tok):
    ids = tok.encode_chat(CONVERSATIONS["code_newlines"])
    plain = tok.decode(ids, skip_special_tokens=True)
    assert "<|im_start|>" not in plain and "<|im_end|>" not in plain
    assert "<tool_call>" in plain  # added but not special, as in Qwen
    assert tok.decode(ids) == tok.render_chat(CONVERSATIONS["code_newlines"])


def test_encode_batch_matches_encode(tok):
    texts = [tok.render_chat(m) for m in CONVERSATIONS.values()]
    assert tok.encode_batch(texts) == [tok.encode(t) for t in texts]


def test_generation_config_eos_ids_are_stop_ids(qwen_dir, tmp_path):
    d = build_qwen_like_tokenizer(tmp_path / "q")
    extra = load_tokenizer(d).token_to_id("<|vision_pad|>")
    (d / "generation_config.json").write_text(json.dumps({"eos_token_id": [extra]}))
    t = load_tokenizer(d)
    assert extra in t.stop_ids and t.im_end_id in t.stop_ids and t.endoftext_id in t.stop_ids


def test_eos_and_pad_come_from_tokenizer_config(tmp_path):
    """A base-model config (eos <|endoftext|>, pad as an AddedToken dict) is honoured; stops still hold <|im_end|>."""
    d = build_qwen_like_tokenizer(tmp_path / "q")
    cfg = json.loads((d / "tokenizer_config.json").read_text())
    cfg["eos_token"] = "<|endoftext|>"
    cfg["pad_token"] = {"__type": "AddedToken", "content": "<|vision_pad|>", "special": True}
    (d / "tokenizer_config.json").write_text(json.dumps(cfg))
    t = load_tokenizer(d)
    assert t.eos_id == t.endoftext_id and t.pad_id == t.token_to_id("<|vision_pad|>")
    assert t.stop_ids == tuple(sorted({t.im_end_id, t.endoftext_id}))


def test_without_tokenizer_config_defaults_to_chatml_ids(tmp_path):
    d = build_qwen_like_tokenizer(tmp_path / "q")
    (d / "tokenizer_config.json").unlink()
    t = load_tokenizer(d)
    assert t.eos_id == t.im_end_id and t.pad_id == t.endoftext_id and t.chat_template is None


# --- sentencepiece -------------------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def spm_path(tmp_path_factory):
    return build_tiny_spm(tmp_path_factory.mktemp("spm") / "tiny.model")


@pytest.fixture(scope="module")
def spm_tok(spm_path):
    return load_tokenizer(spm_path)


def _spm_expected_chat_ids(path, messages, gen):
    """ChatML ids built piecewise with sentencepiece itself: symbols by id, the text between them by Encode."""
    sp = spm.SentencePieceProcessor(model_file=str(path))
    start, end = sp.PieceToId("<|im_start|>"), sp.PieceToId("<|im_end|>")
    ids = []
    for m in messages:
        body = sp.Encode(m["role"] + "\n" + m["content"], out_type=int)
        ids += [start] + body + [end] + sp.Encode("\n", out_type=int)
    if gen:
        ids += [start] + sp.Encode("assistant\n", out_type=int)
    return ids


def test_spm_symbols_and_stop_ids(spm_tok, spm_path):
    sp = spm.SentencePieceProcessor(model_file=str(spm_path))
    ids = {t: sp.PieceToId(t) for t in CHATML_SYMBOLS}
    assert sorted(ids.values()) == [1, 2, 3] and sp.PieceToId("<unk>") == 0
    assert spm_tok.kind == "sentencepiece" and spm_tok.vocab_size == sp.GetPieceSize()
    assert (spm_tok.endoftext_id, spm_tok.im_start_id, spm_tok.im_end_id) == tuple(ids[t] for t in CHATML_SYMBOLS)
    assert spm_tok.eos_id == spm_tok.im_end_id and spm_tok.pad_id == spm_tok.endoftext_id
    assert spm_tok.stop_ids == tuple(sorted({spm_tok.im_end_id, spm_tok.endoftext_id}))
    for t in CHATML_SYMBOLS:
        assert spm_tok.encode(t) == [ids[t]]
        assert spm_tok.encode(f"x{t}y").count(ids[t]) == 1


def test_spm_directory_form(spm_path):
    assert load_tokenizer(spm_path.parent).encode("hello") == load_tokenizer(spm_path).encode("hello")


@pytest.mark.parametrize("name", sorted(CONVERSATIONS))
@pytest.mark.parametrize("gen", [True, False], ids=["gen", "nogen"])
def test_spm_chat_ids_and_round_trip(spm_tok, spm_path, name, gen):
    messages = CONVERSATIONS[name]
    ids = spm_tok.encode_chat(messages, add_generation_prompt=gen)
    if name != "specials_in_content":  # sentencepiece itself would make the content's symbols control ids
        assert ids == _spm_expected_chat_ids(spm_path, messages, gen)
    assert ids.count(spm_tok.im_start_id) == len(messages) + gen
    assert spm_tok.decode(ids) == render_chatml(messages, gen)
    assert ids.count(spm_tok.im_end_id) == len(messages) and spm_tok.endoftext_id not in ids
    plain = spm_tok.decode(ids, skip_special_tokens=True)
    if name == "specials_in_content":  # content's marker strings are plain text: they survive skip_special_tokens
        assert messages[0]["content"] in plain
    else:
        assert not re.search(r"<\|(im_start|im_end|endoftext)\|>", plain)


def test_spm_model_trained_by_hand(tmp_path):
    """A model trained directly with SentencePieceTrainer (not our helper) loads when given the needed options."""
    prefix = tmp_path / "byhand"
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(CORPUS), model_prefix=str(prefix), vocab_size=500, model_type="unigram",
        user_defined_symbols=list(CHATML_SYMBOLS), normalization_rule_name="identity", add_dummy_prefix=False,
        remove_extra_whitespaces=False, byte_fallback=True, hard_vocab_limit=False, minloglevel=2,
    )
    t = load_tokenizer(prefix.with_suffix(".model"))
    for name in ("code_newlines", "unicode"):
        messages = CONVERSATIONS[name]
        ids = t.encode_chat(messages)
        assert ids == _spm_expected_chat_ids(prefix.with_suffix(".model"), messages, True)
        assert t.decode(ids) == t.render_chat(messages)


# --- bad input -----------------------------------------------------------------------------------------------------

def test_missing_path(tmp_path):
    missing = tmp_path / "nope"
    with pytest.raises(FileNotFoundError, match=re.escape(str(missing)) + ".*tokenizer.json"):
        load_tokenizer(missing)


def test_directory_without_tokenizer_files(tmp_path):
    (tmp_path / "config.json").write_text("{}")
    with pytest.raises(FileNotFoundError, match="no tokenizer.json"):
        load_tokenizer(tmp_path)


def test_unsupported_and_malformed_files(tmp_path):
    vocab = tmp_path / "vocab.txt"
    vocab.write_text("a\nb\n")
    with pytest.raises(ValueError, match="unsupported tokenizer file .*vocab.txt"):
        load_tokenizer(vocab)
    bad = tmp_path / "tokenizer.json"
    bad.write_text("{not json")
    with pytest.raises(ValueError, match="not a readable Hugging Face tokenizer.json"):
        load_tokenizer(bad)
    bad_spm = tmp_path / "x.model"
    bad_spm.write_bytes(b"\x00garbage")
    with pytest.raises(ValueError, match="not a readable sentencepiece model"):
        load_tokenizer(bad_spm)


def test_tokenizer_json_without_chatml_tokens(tmp_path):
    from tokenizers import Tokenizer as RustTokenizer, models, pre_tokenizers, trainers

    t = RustTokenizer(models.BPE())
    t.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    t.train_from_iterator(CORPUS, trainer=trainers.BpeTrainer(vocab_size=300, show_progress=False))
    t.save(str(tmp_path / "tokenizer.json"))
    with pytest.raises(ValueError, match=r"no <\|im_start\|> token"):
        load_tokenizer(tmp_path)


def test_spm_with_default_normalisation_is_rejected(tmp_path):
    prefix = tmp_path / "defaults"
    spm.SentencePieceTrainer.train(sentence_iterator=iter(CORPUS), model_prefix=str(prefix), vocab_size=200,
                                   user_defined_symbols=list(CHATML_SYMBOLS), hard_vocab_limit=False, minloglevel=2)
    with pytest.raises(ValueError, match="dummy prefix.*add_dummy_prefix=False"):
        load_tokenizer(prefix.with_suffix(".model"))
    spm.SentencePieceTrainer.train(sentence_iterator=iter(CORPUS), model_prefix=str(prefix), vocab_size=200,
                                   user_defined_symbols=list(CHATML_SYMBOLS), add_dummy_prefix=False,
                                   hard_vocab_limit=False, minloglevel=2)
    with pytest.raises(ValueError, match="does not keep whitespace and newlines"):
        load_tokenizer(prefix.with_suffix(".model"))


def test_spm_without_chatml_symbols(tmp_path):
    prefix = tmp_path / "nochatml"
    spm.SentencePieceTrainer.train(sentence_iterator=iter(CORPUS), model_prefix=str(prefix), vocab_size=150,
                                   hard_vocab_limit=False, minloglevel=2)
    with pytest.raises(ValueError, match="lacks <\\|endoftext\\|>.*user_defined_symbols"):
        load_tokenizer(prefix.with_suffix(".model"))


def test_eos_token_not_in_vocab(qwen_dir, tmp_path):
    d = build_qwen_like_tokenizer(tmp_path / "q")
    cfg = json.loads((d / "tokenizer_config.json").read_text())
    cfg["eos_token"] = {"content": "<|nope|>", "special": True}
    (d / "tokenizer_config.json").write_text(json.dumps(cfg))
    with pytest.raises(ValueError, match="eos_token '<\\|nope\\|>' is not in the vocabulary"):
        load_tokenizer(d)


@pytest.mark.parametrize("messages, err, pattern", [
    ([{"role": "tool", "content": "x"}], ValueError, "message 0: unknown role 'tool'"),
    ([{"role": "user", "content": "a"}, {"role": "bot", "content": "b"}], ValueError, "message 1: unknown role 'bot'"),
    ([{"role": "user"}], ValueError, "must be a dict with 'role' and 'content'"),
    (["hello"], ValueError, "must be a dict"),
    ([{"role": "user", "content": ["a", "b"]}], TypeError, "content must be str"),
])
def test_bad_messages(tok, spm_tok, messages, err, pattern):
    for t in (tok, spm_tok):
        with pytest.raises(err, match=pattern):
            t.encode_chat(messages)
        with pytest.raises(err, match=pattern):
            t.render_chat(messages)
