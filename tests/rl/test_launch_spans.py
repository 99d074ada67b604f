"""Launch-statement spans and the §2.2 character→token rule, on a real byte-level BPE's decoded pieces."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sera_jax.rl.launch_spans import (
    decoded_prefix_lengths, delegate_block_spans, launch_statement_spans, launch_token_mask, place_spans,
    spans_to_token_mask,
)


def _texts(code, spans):
    return [code[s:e] for s, e in spans]


def test_statement_spans_climb_to_the_enclosing_statement():
    code = ('x = get_info(["stick"])\n'
            'r = await launch_subagent({"stick": 4}, "ctx")\n'
            'rs = await asyncio.gather(launch_subagent({"a": 1}), agent.launch_subagent({"b": 2}))\n'
            'for t in todo:\n'
            '    out = await launch_subagent(t)\n'
            'print("launch_subagent")  # launch_subagent\n')
    assert _texts(code, launch_statement_spans(code)) == [
        'r = await launch_subagent({"stick": 4}, "ctx")',
        'rs = await asyncio.gather(launch_subagent({"a": 1}), agent.launch_subagent({"b": 2}))',
        'out = await launch_subagent(t)',
    ]


def test_call_in_a_compound_header_takes_the_whole_compound_statement():
    code = 'if await launch_subagent({"a": 1}):\n    print(1)\nz = 2'
    assert _texts(code, launch_statement_spans(code)) == ['if await launch_subagent({"a": 1}):\n    print(1)']


def test_utf8_columns_become_character_offsets():
    code = 'note = "café 🌲"; r = await launch_subagent({"plank": 2}, "naïve 🌲")\n'
    (span,) = launch_statement_spans(code)
    assert code[span[0]:span[1]] == 'r = await launch_subagent({"plank": 2}, "naïve 🌲")'


def test_unparsable_and_mention_only():
    bad = 'r = await launch_subagent({"a": 1}\nprint(('
    assert launch_statement_spans(bad) == [(0, len(bad))]
    assert launch_statement_spans("print((") == []
    assert launch_statement_spans('s = "launch_subagent"\n# launch_subagent(x)') == []


def test_delegate_blocks():
    text = 'I will split.\n<delegate goal="a">x</delegate>\nand\n<delegate goal="b">\ny\n</delegate> done'
    assert _texts(text, delegate_block_spans(text)) == ['<delegate goal="a">x</delegate>',
                                                        '<delegate goal="b">\ny\n</delegate>']
    assert _texts("<delegate goal='c'>open", delegate_block_spans("<delegate goal='c'>open")) == \
        ["<delegate goal='c'>open"]


def test_place_spans_exact_stripped_and_missing():
    code = "a = 1\nb = 2"
    text = "<python>" + code + "</python>"
    assert place_spans(code, [(6, 11)], text) == [(14, 19)]
    padded = "\n  " + code + "\n"
    assert place_spans(padded, [(9, 14)], text) == [(14, 19)]   # shifted by the 3 stripped leading chars
    assert place_spans("zzz", [(0, 3)], text) is None


def test_span_to_token_rule_on_hand_lengths():
    # tokens decode to "ab" | "cde" | "f" | "gh": prefix lengths 0, 2, 5, 6, 8
    pl = [0, 2, 5, 6, 8]
    assert spans_to_token_mask([(3, 5)], pl, 4) == [0, 1, 0, 0]   # "de" inside token 1
    assert spans_to_token_mask([(2, 6)], pl, 4) == [0, 1, 1, 0]   # exactly tokens 1..2
    assert spans_to_token_mask([(1, 3)], pl, 4) == [1, 1, 0, 0]   # straddles a boundary: both tokens
    assert spans_to_token_mask([(5, 5)], pl, 4) == [0, 0, 0, 0]   # empty span
    assert spans_to_token_mask([(9, 12)], pl, 4) == [0, 0, 0, 0]  # beyond the text


def test_span_to_token_rule_on_real_decoded_pieces(bpe, decode):
    text = '<thought>plan é 🌲</thought>\n<python>r = await launch_subagent({"stick": 4}, "use planks")\n' \
           'print(r)</python><|im_end|>'
    ids = bpe.encode(text).ids
    assert decode(ids) == text
    pl = decoded_prefix_lengths(ids, decode)
    start = text.index("r = await")
    end = text.index("\nprint(r)")
    mask = spans_to_token_mask([(start, end)], pl, len(ids))
    marked = [k for k, m in enumerate(mask) if m]
    assert marked == list(range(marked[0], marked[-1] + 1))
    # The marked tokens decode to a string containing the statement, and trimming either end token loses part
    # of it: the mask is the smallest token run covering exactly these characters.
    lo, hi = pl[marked[0]], pl[marked[-1] + 1]
    assert lo <= start and hi >= end
    assert pl[marked[0] + 1] > start and pl[marked[-1]] < end


@st.composite
def code_with_launches(draw):
    """Random TextCraft cells built line by line, with the launch statements' character ranges known."""
    pool = [
        ('x{i} = get_info(["oak_log"])', False),
        ('craft({{"oak_planks": 1}}, ("stick", {i}))', False),
        ('print("launch_subagent is async")  # launch_subagent', False),
        ('r{i} = await launch_subagent({{"stick": {i}}}, "make {i} sticks")', True),
        ('rs = await asyncio.gather(launch_subagent({{"a": {i}}}), launch_subagent({{"b": 2}}))', True),
        ('await launch_subagent({{"plank": {i}}})', True),
    ]
    lines, expected, pos = [], [], 0
    n = draw(st.integers(1, 6))
    for i in range(n):
        template, is_launch = draw(st.sampled_from(pool))
        indent = ""
        if draw(st.booleans()):
            head = f"for k{i} in range(1):"
            lines.append(head)
            pos += len(head) + 1
            indent = "    "
        line = indent + template.format(i=i)
        if is_launch:
            expected.append((pos + len(indent), pos + len(line)))
        lines.append(line)
        pos += len(line) + 1
    return "\n".join(lines) + "\n", expected


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(case=code_with_launches())
def test_masks_cover_exactly_the_launch_statements(case, bpe, decode):
    code, expected = case
    assert launch_statement_spans(code) == expected
    completion = "<thought>go</thought>\n<python>" + code + "</python><|im_end|>"
    ids = bpe.encode(completion).ids
    mask = launch_token_mask(code, ids, decode)
    pl = decoded_prefix_lengths(ids, decode)
    off = completion.index(code)
    chars = {c for s, e in expected for c in range(s + off, e + off)}
    # A token is marked iff its decoded characters intersect a launch statement.
    for k in range(len(ids)):
        touches = any(c in chars for c in range(pl[k], pl[k + 1]))
        assert bool(mask[k]) == touches, (k, completion[pl[k]:pl[k + 1]])
    assert any(mask) == bool(expected)


def test_launch_token_mask_textworld_and_missing_code(bpe, decode):
    reply = 'Split it.\n<delegate goal="open the chest">take key, unlock chest</delegate>'
    ids = bpe.encode(reply).ids
    mask = launch_token_mask(reply, ids, decode, env="textworld_sync")
    pl = decoded_prefix_lengths(ids, decode)
    first = mask.index(1)
    assert pl[first] <= reply.index("<delegate") < pl[first + 1]
    assert sum(mask) < len(ids) and mask[-1] == 1
    assert launch_token_mask("r = await launch_subagent({})", ids, decode) == [0] * len(ids)
    with pytest.raises(ValueError):
        launch_token_mask(reply, ids, decode, env="minecraft")
