"""Token-level history (``RuntimeSettings.token_history``): each prompt extends the last one with the tokens the
policy sampled, so a non-canonical sample or a merge across the generation prompt never re-tokenizes the history."""

from __future__ import annotations

import asyncio

import pytest

from sera_jax.agents.runtime import run_tree
from sera_jax.agents.scripted import ScriptedGenerator
from sera_jax.agents.settings import RuntimeSettings
from sera_jax.agents.truncation import build_prompt, continue_prompt
from sera_jax.assembly.tokenizer import SHIPPED
from sera_jax.model.tokenizer import load_tokenizer, render_chatml
from sera_jax.rl.datums import merge_turns


@pytest.fixture(scope="module")
def spm():
    return load_tokenizer(SHIPPED)  # the tiny default's sentencepiece tokenizer


BASE = [{"role": "system", "content": "You craft items with Python tools."},
        {"role": "user", "content": "Craft the following items: 2x c7_i2"}]
REPLY = "<thought>Look it up.</thought>\n<python>r = get_info(['c7_i2'])[0]\nprint(r)</python>"


def _char_ids(tok, text):
    """A non-canonical segmentation of ``text``: one piece per character (what sampling at T=1 can produce)."""
    return [i for ch in text for i in tok.encode(ch)]


def test_continuation_holds_the_sampled_tokens_and_decodes_to_the_raw_conversation(spm):
    prev = build_prompt(spm, BASE, 4000)
    comp = _char_ids(spm, REPLY)
    assert comp != spm.encode(REPLY)
    msgs = BASE + [{"role": "assistant", "content": "re-composed reply"}, {"role": "user", "content": "[Out] 1"}]
    p = continue_prompt(spm, prev, comp, msgs, 4000)
    n = len(prev.ids) + len(comp)
    assert p is not None and p.continued and p.info()["token_history"] and p.messages == msgs
    assert p.ids[:n] == prev.ids + comp and p.ids[n] == spm.im_end_id
    raw = BASE + [{"role": "assistant", "content": REPLY}, msgs[-1]]
    assert spm.decode(p.ids) == render_chatml(raw)
    # Re-encoding the same conversation (the reference rule) does not keep the sampled tokens as a prefix.
    assert spm.encode_chat(raw)[:n] != prev.ids + comp
    # A completion that ended with <|im_end|> is not closed twice.
    q = continue_prompt(spm, prev, comp + [spm.im_end_id], msgs, 4000)
    assert q.ids == p.ids


def test_continuation_declines_what_it_cannot_extend(spm):
    prev = build_prompt(spm, BASE, 4000)
    comp = spm.encode(REPLY)
    good = BASE + [{"role": "assistant", "content": REPLY}, {"role": "user", "content": "ok"}]
    assert continue_prompt(spm, prev, comp, good, 4000) is not None
    assert continue_prompt(spm, prev, comp, good[:3], 4000) is None  # no message after the reply
    edited = [dict(BASE[0], content="other rules")] + good[1:]
    assert continue_prompt(spm, prev, comp, edited, 4000) is None  # the history changed
    assert continue_prompt(spm, prev, comp, good, len(prev.ids) + len(comp) + 3) is None  # over the cap
    other_stop = next(i for i in spm.stop_ids if i != spm.im_end_id)
    assert continue_prompt(spm, prev, comp + [other_stop], good, 4000) is None
    cut = build_prompt(spm, [BASE[0], {"role": "user", "content": "task " * 400}], 300)
    assert cut.head_tail and continue_prompt(spm, cut, comp, cut.messages + good[2:], 4000) is None


def py(code: str) -> str:
    return f"<thought>next</thought>\n<python>{code}</python>"


def _run(task, tok, token_history, max_prompt_tokens=9600):
    script = {"root": [py("print(get_info(['o5_i2_15']))"), py("print(get_info(['o3_i1']))"),
                       py("print('x' * 200)"), py("finish('done')")]}
    gen = ScriptedGenerator(_PerChar(tok), script)  # non-canonical completions, as a sampling policy makes them
    settings = RuntimeSettings.for_env("textcraft", max_prompt_tokens=max_prompt_tokens,
                                       token_history=token_history)
    return asyncio.run(run_tree(task, "textcraft", gen, tok, settings))


class _PerChar:
    """The tokenizer seen by the scripted generator: encodes one piece per character (non-canonical samples)."""

    def __init__(self, tok):
        self._tok = tok

    def encode(self, text, add_special_tokens=False):
        return _char_ids(self._tok, text)

    def __getattr__(self, name):
        return getattr(self._tok, name)


def test_an_agent_with_token_history_keeps_one_growing_sequence_and_one_datum(tc_task, spm):
    tree = _run(tc_task, spm, True)
    turns = tree.root.turns
    assert len(turns) == 4 and tree.root.finish_message == "done"
    for a, b in zip(turns, turns[1:]):
        assert b.prompt_ids[:len(a.prompt_ids) + len(a.completion_ids)] == a.prompt_ids + a.completion_ids
        assert b.misc["token_history"]
    assert not turns[0].misc["token_history"]
    assert len(merge_turns(turns)) == 1  # the spec's prefix merging: the whole agent is one datum
    # The reference rule re-encodes the history: the same run splits into one datum per turn.
    plain = _run(tc_task, spm, False).root.turns
    assert len(merge_turns(plain)) == len(plain) == 4


def test_token_history_falls_back_to_truncation_when_the_cap_is_reached(tc_task, spm):
    full = _run(tc_task, spm, True).root.turns
    cap = len(full[-1].prompt_ids) - 1  # the last turn no longer fits: the §1.3 rule rebuilds it
    turns = _run(tc_task, spm, True, max_prompt_tokens=cap).root.turns
    assert [t.misc["token_history"] for t in turns] == [False, True, True, False]
    # Rebuilt from the messages: the canonical encoding is shorter than the per-character history, so it fits.
    last = turns[-1]
    assert len(last.prompt_ids) <= cap and last.misc["dropped_pairs"] == 0
    assert spm.decode(last.prompt_ids).endswith("<|im_start|>assistant\n")
    assert spm.decode(last.prompt_ids).startswith(spm.decode(turns[0].prompt_ids))
