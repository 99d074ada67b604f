"""One tokenizer interface over a Hugging Face ``tokenizer.json`` and a sentencepiece ``.model``.

The policy speaks Qwen's ChatML in both cases::

    <|im_start|>{role}\\n{content}<|im_end|>\\n   (per message)
    <|im_start|>assistant\\n                      (the generation prompt)

Qwen3-Instruct-2507 is a non-thinking model and inserts no default system prompt, so neither do we.

* ``tokenizer.json`` (Qwen's real tokenizer, or any byte-level BPE that carries the ChatML added tokens) is read with
  the ``tokenizers`` library. ``tokenizer_config.json`` beside it, when present, names the eos and pad tokens (Qwen3
  Instruct: eos ``<|im_end|>``, pad ``<|endoftext|>``) and carries the jinja ``chat_template`` (kept for reference; we
  render ChatML in Python so the runtime needs no jinja). ``generation_config.json``'s ``eos_token_id`` list, when
  present, is added to the stop ids.
* A sentencepiece ``.model`` (the tiny CPU default policy) must have been trained with ``<|endoftext|>``,
  ``<|im_start|>`` and ``<|im_end|>`` as ``user_defined_symbols``, so that these strings, written in text, encode to
  one id each. :func:`train_sentencepiece` trains such a model with the options that also keep newlines and spaces
  intact (identity normalisation, no dummy prefix, byte fallback).

``encode(text)`` splits special-token strings out of raw text (as Qwen's tokenizer does): it is for text the caller
owns, such as a raw completions prompt. ``encode_chat(messages)`` keeps the template's own markers special and
encodes every message's *content* as plain text: a cell output, an observation or a served message that holds
``<|im_end|>`` or ``<|im_start|>system`` gets ordinary pieces for those characters, never a control token (the HF
path encodes content with special-token matching off, as transformers' ``split_special_tokens``; the sentencepiece
path breaks each user-defined symbol's string before encoding, since sentencepiece always matches them). For content
without special-token strings, ``encode_chat(messages)`` is exactly ``encode(render_chat(messages))``, the id
sequence of transformers' ``apply_chat_template``.

No encode raises on a string: surrogate code points (a lone ``\ud800`` a cell printed), which no UTF-8 tokenizer can
take, become U+FFFD first, the marker ``envs_py.text.valid_text`` uses at the runtime's boundary (the rule is
repeated here because the model room imports no environment code).
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from sera_jax.model.plain_text import (
    breaks_pattern,
    encode_fragments,
    user_defined_symbols,
    valid_text,
)

ENDOFTEXT = "<|endoftext|>"
IM_START = "<|im_start|>"
IM_END = "<|im_end|>"
CHATML_SYMBOLS = (ENDOFTEXT, IM_START, IM_END)
CHAT_ROLES = ("system", "user", "assistant")

_EXPECTED = "a directory holding tokenizer.json (or a sentencepiece .model), a tokenizer.json file, or a .model file"


class _Backend(Protocol):
    vocab_size: int

    def encode(self, text: str, add_special_tokens: bool) -> list[int]: ...

    def encode_batch(self, texts: Sequence[str], add_special_tokens: bool) -> list[list[int]]: ...

    def encode_plain_batch(self, texts: Sequence[str]) -> list[list[int]]: ...

    def decode(self, ids: Sequence[int], skip_special_tokens: bool) -> str: ...

    def token_to_id(self, token: str) -> int | None: ...


class _HFBackend:
    """``tokenizers.Tokenizer`` from a tokenizer.json."""

    def __init__(self, path: Path):
        from tokenizers import Tokenizer as _RustTokenizer

        try:
            self._tok = _RustTokenizer.from_file(str(path))
        except Exception as e:  # the Rust side raises a bare Exception on malformed files
            raise ValueError(f"{path}: not a readable Hugging Face tokenizer.json ({e})") from e
        self.vocab_size = self._tok.get_vocab_size(with_added_tokens=True)
        # A second copy that never matches tokens flagged special (one flag per object, and prompts are encoded from
        # several threads, so the flag is never toggled on the shared one).
        self._plain = _RustTokenizer.from_str(self._tok.to_str())
        self._plain.encode_special_tokens = True
        self._breaks: re.Pattern | None = None

    def set_controls(self, ids: Iterable[int]) -> None:
        """Makes plain text break the strings of those control ``ids`` that the plain copy still matches (added tokens
        a tokenizer.json did not flag special); returns None."""
        strings = []
        for i in sorted(set(ids)):
            token = self._tok.id_to_token(i)
            if token and self._plain.encode(token, add_special_tokens=False).ids == [i]:
                strings.append(token)
        self._breaks = breaks_pattern(strings)

    def encode(self, text: str, add_special_tokens: bool) -> list[int]:
        return self._tok.encode(text, add_special_tokens=add_special_tokens).ids

    def encode_batch(self, texts: Sequence[str], add_special_tokens: bool) -> list[list[int]]:
        return [e.ids for e in self._tok.encode_batch(list(texts), add_special_tokens=add_special_tokens)]

    def encode_plain_batch(self, texts: Sequence[str]) -> list[list[int]]:
        if self._breaks is None:
            return [e.ids for e in self._plain.encode_batch(list(texts), add_special_tokens=False)]
        return encode_fragments(texts, self._breaks,
                                lambda xs: [e.ids for e in self._plain.encode_batch(xs, add_special_tokens=False)])

    def decode(self, ids: Sequence[int], skip_special_tokens: bool) -> str:
        return self._tok.decode(list(ids), skip_special_tokens=skip_special_tokens)

    def token_to_id(self, token: str) -> int | None:
        return self._tok.token_to_id(token)


class _SPMBackend:
    """``sentencepiece.SentencePieceProcessor`` from a .model; ChatML symbols are user-defined pieces."""

    def __init__(self, path: Path):
        import sentencepiece as spm

        self._sp = spm.SentencePieceProcessor()
        try:
            self._sp.Load(str(path))
        except Exception as e:  # OSError / RuntimeError depending on the failure
            raise ValueError(f"{path}: not a readable sentencepiece model ({e})") from e
        self.vocab_size = self._sp.GetPieceSize()
        # Ids dropped by skip_special_tokens: control pieces (<s>, </s>, <pad>) and the ChatML symbols.
        self._special = frozenset(
            i for i in (self.token_to_id(t) for t in CHATML_SYMBOLS) if i is not None
        ) | frozenset(i for i in (self._sp.bos_id(), self._sp.eos_id(), self._sp.pad_id()) if i >= 0)
        # sentencepiece matches user-defined symbols anywhere in text and has no switch to stop it: plain text gets
        # each occurrence broken before it is encoded.
        self._breaks = breaks_pattern(user_defined_symbols(self._sp, CHATML_SYMBOLS))

    def encode(self, text: str, add_special_tokens: bool) -> list[int]:
        return self._sp.Encode(text, out_type=int, add_bos=add_special_tokens and self._sp.bos_id() >= 0)

    def encode_batch(self, texts: Sequence[str], add_special_tokens: bool) -> list[list[int]]:
        return self._sp.Encode(list(texts), out_type=int, add_bos=add_special_tokens and self._sp.bos_id() >= 0)

    def encode_plain_batch(self, texts: Sequence[str]) -> list[list[int]]:
        return encode_fragments(texts, self._breaks, lambda xs: self._sp.Encode(xs, out_type=int))

    def decode(self, ids: Sequence[int], skip_special_tokens: bool) -> str:
        ids = [int(i) for i in ids]
        if skip_special_tokens:
            ids = [i for i in ids if i not in self._special]
        return self._sp.Decode(ids)

    def token_to_id(self, token: str) -> int | None:
        i = self._sp.PieceToId(token)
        # PieceToId answers unk for an unknown piece; only a piece that round-trips is really there.
        return i if self._sp.IdToPiece(i) == token else None


@dataclass(frozen=True)
class Tokenizer:
    """A loaded tokenizer (build it with :func:`load_tokenizer`).

    Attributes: ``path`` (the file read), ``kind`` ("hf" or "sentencepiece"), ``vocab_size`` (tokenizer vocabulary
    including added tokens; a model's embedding may be larger, e.g. Qwen3's 151936 rows for 151669 tokens),
    ``eos_id``, ``pad_id``, ``im_start_id``, ``im_end_id``, ``endoftext_id`` (None if absent), ``stop_ids`` (sorted
    tuple of ids that end a generation: <|im_end|>, <|endoftext|>, eos, and generation_config's eos ids) and
    ``chat_template`` (the jinja template from tokenizer_config.json, if any; informational).
    """

    path: Path
    kind: str
    vocab_size: int
    eos_id: int
    pad_id: int
    im_start_id: int
    im_end_id: int
    endoftext_id: int | None
    stop_ids: tuple[int, ...]
    chat_template: str | None = None
    _backend: _Backend = field(default=None, repr=False, compare=False)  # type: ignore[assignment]

    def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
        """Returns the token ids of raw ``text``; special-token strings in it (``<|im_start|>``…) become their single
        ids (for text the caller owns: a conversation's content goes through :meth:`encode_chat`).

        ``add_special_tokens`` applies the tokenizer's own post-processing (Qwen's adds nothing; a sentencepiece model
        with a bos piece gets it prepended). Surrogate code points are encoded as U+FFFD.
        """
        return self._backend.encode(valid_text(text), add_special_tokens)

    def encode_batch(self, texts: Sequence[str], add_special_tokens: bool = False) -> list[list[int]]:
        """Returns ``[encode(t) for t in texts]``, computed in one native call."""
        return self._backend.encode_batch([valid_text(t) for t in texts], add_special_tokens)

    def encode_plain(self, text: str) -> list[int]:
        """Returns the token ids of ``text`` as plain text: no special-token string in it becomes a special id (the
        encoding of a message's content; surrogate code points as U+FFFD)."""
        return self._backend.encode_plain_batch([valid_text(text)])[0]

    def decode(self, ids: Iterable[int], skip_special_tokens: bool = False) -> str:
        """Returns the text of ``ids``; with ``skip_special_tokens`` the special/ChatML tokens are left out."""
        return self._backend.decode(list(ids), skip_special_tokens)

    def token_to_id(self, token: str) -> int | None:
        """Returns the id of one vocabulary entry, or None if the vocabulary lacks it."""
        return self._backend.token_to_id(token)

    def render_chat(self, messages: Sequence[Mapping[str, Any]], add_generation_prompt: bool = True) -> str:
        """Returns the ChatML text of ``messages`` (dicts with ``role`` in system/user/assistant and str ``content``).

        Each message is ``<|im_start|>{role}\\n{content}<|im_end|>\\n``; ``add_generation_prompt`` appends
        ``<|im_start|>assistant\\n``. No default system prompt is inserted (Qwen3-Instruct-2507).
        Raises ValueError for an unknown role or a malformed message, TypeError for non-str content.
        """
        return render_chatml(messages, add_generation_prompt)

    def encode_chat(self, messages: Sequence[Mapping[str, Any]], add_generation_prompt: bool = True, *,
                    prefix: str = "") -> list[int]:
        """Returns the token ids of the ChatML conversation :meth:`render_chat` writes, with the template's markers
        as their special ids and each message's content encoded as plain text (:meth:`encode_plain`): a
        special-token string in content is ordinary pieces, never a control token. For content without such strings
        this is exactly ``encode(render_chat(messages))``, what ``apply_chat_template(..., tokenize=True)`` gives.

        ``prefix`` is template text encoded (as raw text) before the first message, e.g. the ``"\\n"`` that follows a
        sampled ``<|im_end|>`` when a conversation is continued token by token. Raises as :meth:`render_chat`.
        """
        turns = _checked(messages)
        b = self._backend
        bodies = b.encode_plain_batch([f"{role}\n{valid_text(content)}" for role, content in turns]
                                      + ["\n", "assistant\n"])
        newline, generation = bodies[-2], bodies[-1]
        ids = b.encode(valid_text(prefix), False) if prefix else []
        for body in bodies[:-2]:
            ids.append(self.im_start_id)
            ids.extend(body)
            ids.append(self.im_end_id)
            ids.extend(newline)
        if add_generation_prompt:
            ids.append(self.im_start_id)
            ids.extend(generation)
        return ids


def _checked(messages: Sequence[Mapping[str, Any]]) -> list[tuple[str, str]]:
    """The (role, content) pairs of ``messages``; ValueError for an unknown role or a malformed message, TypeError
    for non-str content."""
    out = []
    for k, m in enumerate(messages):
        if not isinstance(m, Mapping) or "role" not in m or "content" not in m:
            raise ValueError(f"message {k} must be a dict with 'role' and 'content', got {m!r}")
        role, content = m["role"], m["content"]
        if role not in CHAT_ROLES:
            raise ValueError(f"message {k}: unknown role {role!r}; expected one of {', '.join(CHAT_ROLES)}")
        if not isinstance(content, str):
            raise TypeError(f"message {k}: content must be str, got {type(content).__name__}")
        out.append((role, content))
    return out


def render_chatml(messages: Sequence[Mapping[str, Any]], add_generation_prompt: bool = True) -> str:
    """Returns the ChatML rendering of ``messages`` (see :meth:`Tokenizer.render_chat`)."""
    parts = [f"{IM_START}{role}\n{content}{IM_END}\n" for role, content in _checked(messages)]
    if add_generation_prompt:
        parts.append(f"{IM_START}assistant\n")
    return "".join(parts)


def load_tokenizer(path: str | Path) -> Tokenizer:
    """Returns a :class:`Tokenizer` read from ``path``.

    ``path`` is a directory (its tokenizer.json, else its single ``*.model``), a tokenizer.json file, or a
    sentencepiece ``.model`` file. Raises FileNotFoundError when nothing loadable is there and ValueError when the
    file is unreadable or lacks the ChatML tokens.
    """
    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"tokenizer path {path} does not exist; expected {_EXPECTED}")
    if path.is_dir():
        if (path / "tokenizer.json").is_file():
            path = path / "tokenizer.json"
        else:
            models = sorted(path.glob("*.model"))
            if len(models) != 1:
                found = "no" if not models else f"{len(models)} ({', '.join(p.name for p in models)})"
                raise FileNotFoundError(
                    f"tokenizer directory {path} has no tokenizer.json and {found} sentencepiece .model files; "
                    f"expected {_EXPECTED}"
                )
            path = models[0]
    if path.suffix == ".json":
        return _load_hf(path)
    if path.suffix == ".model":
        return _load_spm(path)
    raise ValueError(f"unsupported tokenizer file {path}; expected {_EXPECTED}")


def _read_json(path: Path) -> dict:
    if not path.is_file():
        return {}
    try:
        with open(path, encoding="utf-8") as f:
            data = json.load(f)
    except json.JSONDecodeError as e:
        raise ValueError(f"{path}: invalid JSON ({e})") from e
    if not isinstance(data, dict):
        raise ValueError(f"{path}: expected a JSON object, got {type(data).__name__}")
    return data


def _token_name(value: Any) -> str | None:
    """A special token as tokenizer_config.json writes it: a string or an AddedToken dict with 'content'."""
    if isinstance(value, str):
        return value
    if isinstance(value, Mapping) and isinstance(value.get("content"), str):
        return value["content"]
    return None


def _require_single(backend: _Backend, path: Path, token: str) -> int:
    tid = backend.token_to_id(token)
    if tid is None:
        raise ValueError(f"{path}: tokenizer has no {token} token; ChatML needs {', '.join(CHATML_SYMBOLS[1:])}")
    if backend.encode(token, False) != [tid]:
        # In the vocabulary but not split out of text: it would be byte-encoded instead of becoming one id.
        raise ValueError(f"{path}: {token} is in the vocabulary but not a special/added token, so text holding it "
                         f"does not encode to its single id {tid}")
    return tid


def _load_hf(path: Path) -> Tokenizer:
    backend = _HFBackend(path)
    config = _read_json(path.parent / "tokenizer_config.json")
    gen_config = _read_json(path.parent / "generation_config.json")
    im_start = _require_single(backend, path, IM_START)
    im_end = _require_single(backend, path, IM_END)
    endoftext = backend.token_to_id(ENDOFTEXT)

    def config_id(key: str) -> int | None:
        name = _token_name(config.get(key))
        if name is None:
            return None
        tid = backend.token_to_id(name)
        if tid is None:
            raise ValueError(f"{path.parent / 'tokenizer_config.json'}: {key} {name!r} is not in the vocabulary")
        return tid

    eos = config_id("eos_token")
    eos = im_end if eos is None else eos  # a chat policy ends its turn with <|im_end|>
    pad = config_id("pad_token")
    pad = pad if pad is not None else (endoftext if endoftext is not None else eos)
    gen_eos = gen_config.get("eos_token_id", [])
    gen_eos = [gen_eos] if isinstance(gen_eos, int) else [i for i in gen_eos if isinstance(i, int)]
    stops = {im_end, eos, *gen_eos} | ({endoftext} if endoftext is not None else set())
    template = config.get("chat_template")
    backend.set_controls({im_start, im_end, eos, pad, *stops})
    return Tokenizer(
        path=path, kind="hf", vocab_size=backend.vocab_size, eos_id=eos, pad_id=pad, im_start_id=im_start,
        im_end_id=im_end, endoftext_id=endoftext, stop_ids=tuple(sorted(stops)),
        chat_template=template if isinstance(template, str) else None, _backend=backend,
    )


def _load_spm(path: Path) -> Tokenizer:
    backend = _SPMBackend(path)
    ids = {}
    for token in CHATML_SYMBOLS:
        ids[token] = backend.token_to_id(token)
        if ids[token] is None:
            raise ValueError(f"{path}: sentencepiece model lacks {token}; train it with user_defined_symbols="
                             f"{list(CHATML_SYMBOLS)} (see train_sentencepiece)")
        if backend.encode(token, False) != [ids[token]]:
            raise ValueError(f"{path}: {token} does not encode to its single id {ids[token]} (the model adds a dummy "
                             f"prefix); train it with add_dummy_prefix=False (see train_sentencepiece)")
    # ChatML's newlines and the content's spaces must survive encode/decode, or turns would not re-render exactly.
    probe = f"{IM_START}user\n  \n\n{IM_END}\n"
    if backend.decode(backend.encode(probe, False), False) != probe:
        raise ValueError(f"{path}: sentencepiece model does not keep whitespace and newlines ({probe!r} does not "
                         f"round-trip); train it with normalization_rule_name='identity', "
                         f"remove_extra_whitespaces=False, byte_fallback=True (see train_sentencepiece)")
    return Tokenizer(
        path=path, kind="sentencepiece", vocab_size=backend.vocab_size, eos_id=ids[IM_END], pad_id=ids[ENDOFTEXT],
        im_start_id=ids[IM_START], im_end_id=ids[IM_END], endoftext_id=ids[ENDOFTEXT],
        stop_ids=tuple(sorted({ids[IM_END], ids[ENDOFTEXT]})), _backend=backend,
    )


def train_sentencepiece(
    texts: Iterable[str], model_path: str | Path, vocab_size: int, *, model_type: str = "bpe",
    extra_symbols: Sequence[str] = (), **trainer_options: Any,
) -> Path:
    """Trains a sentencepiece model fit for :func:`load_tokenizer` and returns the path of the written ``.model``.

    The ChatML symbols (<|endoftext|>, <|im_start|>, <|im_end|>, then ``extra_symbols``) are user-defined symbols,
    so they are single ids (0 unk, then these in order) that text containing them encodes to. Normalisation is
    identity with no dummy prefix and no whitespace squashing, and unknown characters fall back to bytes, so
    ``decode(encode(text)) == text`` for any text. ``model_path`` may end in ``.model`` or be a prefix;
    ``trainer_options`` go to ``SentencePieceTrainer.train`` as they are.
    """
    import sentencepiece as spm

    model_path = Path(model_path)
    prefix = model_path.with_suffix("") if model_path.suffix == ".model" else model_path
    prefix.parent.mkdir(parents=True, exist_ok=True)
    options: dict[str, Any] = dict(
        model_type=model_type, vocab_size=vocab_size, user_defined_symbols=list(CHATML_SYMBOLS) + list(extra_symbols),
        normalization_rule_name="identity", add_dummy_prefix=False, remove_extra_whitespaces=False,
        split_digits=True, byte_fallback=True, character_coverage=1.0,
        unk_id=0, bos_id=-1, eos_id=-1, pad_id=-1, hard_vocab_limit=False, minloglevel=2,
    )
    options.update(trainer_options)
    spm.SentencePieceTrainer.train(sentence_iterator=iter(texts), model_prefix=str(prefix), **options)
    return prefix.with_suffix(".model")
