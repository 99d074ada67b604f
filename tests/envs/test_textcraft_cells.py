"""CodeAct reply parsing, observation text, loop guard."""

from envs_py.textcraft import is_stuck, observation_text, parse_reply, subagent_result_text


def test_parse_reply():
    assert parse_reply("<thought>a</thought>\n<python>x = 1</python>") == ("a", "x = 1")
    assert parse_reply("<thought>a</thought>\n<python>x = 1") == ("a", "x = 1")  # stop string cut it
    assert parse_reply("junk <python>y</python> <thought>t</thought>") == ("t", "y")
    assert parse_reply("no tags") == ("", "")


def test_observation_text():
    assert observation_text(1, "") == "[Cell 1 Output]\n(No output)\n\nProvide your next action."
    assert observation_text(2, "Out[2]: {'a': 1}\n", "boom") == \
        "[Cell 2 Output]\n{'a': 1}\n\nError: boom\n\nProvide your next action."
    assert "x\nOut[3]: 5" in observation_text(3, "x\nOut[3]: 5\n")


def test_is_stuck():
    assert is_stuck(["a"] * 4) and not is_stuck(["a"] * 3)
    assert is_stuck(["x", "a", "b"] * 4) and not is_stuck(["a", "b", "c", "a", "b", "d", "a", "b"])


def test_subagent_result_text():
    assert subagent_result_text("done", 3, 20, 17) == \
        "done\n\nBudget used by subagent: 3/20 steps. Total remaining budget for the current task is 17 steps.\n"
