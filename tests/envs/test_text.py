"""Text from a sandbox or a world is data (issue 55 part 1): every string reaching the runtime encodes as UTF-8, and
each surrogate code point is marked with U+FFFD where it was repaired."""

from __future__ import annotations

import dataclasses
from collections import namedtuple

from envs_py.text import REPLACEMENT, valid_text, valid_tree
from envs_py.textworld_sync.protocol import parse_reply


def test_valid_text_repairs_every_surrogate_and_keeps_valid_text():
    assert valid_text("a\ud800b\udfff\ud83d\ude00c") == f"a{REPLACEMENT}b{REPLACEMENT}{REPLACEMENT}{REPLACEMENT}c"
    ok = "plain ✓ \U0001F600 text"
    assert valid_text(ok) is ok

    class S(str):
        pass

    assert type(valid_text(S("x"))) is str


def test_valid_tree_reaches_keys_values_containers_and_dataclasses():
    @dataclasses.dataclass
    class R:
        output: str
        n: int = 0

    P = namedtuple("P", "a b")
    obj = {"k\ud800": ["x\udcff", ("y", P("\ud800", 1))], "r": R("o\ud800", 3), "s": {"\udfff"}, "n": 5}
    clean = valid_tree(obj)
    assert clean == {"k\ufffd": ["x\ufffd", ("y", P("\ufffd", 1))], "r": R("o\ufffd", 3), "s": {"\ufffd"}, "n": 5}
    assert isinstance(clean["k\ufffd"][1][1], P)
    str(clean).encode("utf-8")
    same = {"a": ["b", ("c",)], "r": R("d")}
    assert valid_tree(same) is same  # nothing to repair: the same objects


def test_a_delegated_goal_with_json_surrogate_escapes_is_repaired():
    r = parse_reply('<delegate>{"goal": "make dish_1 \\ud800 now", "max_steps": 3}</delegate>')
    assert r.kind == "delegate" and r.delegations[0].goal == "make dish_1 \ufffd now"
    r = parse_reply('<delegate>{"delegations": [{"goal": "\\udcff"}, {"goal": "b", "max_steps": true}]}</delegate>')
    assert r.kind == "invalid" and "positive integer" in r.error
    r = parse_reply("<finish>done \ud800</finish>")
    assert r.kind == "finish" and r.message == "done \ufffd"
