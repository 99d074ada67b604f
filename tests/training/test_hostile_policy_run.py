"""A run survives its policy (issue 55 part 4): a short training run whose scripted policy writes every hostile cell
class of the issue (tools/hostile_policy_run.py) finishes and trains, each affected trajectory is counted, and no
sub-agent reward comes from a malformed request.

Before the fix (the same script on fc2ab2e, one class at a time; docs/results/sandbox.md): a surrogate printed,
raised or passed to finish() ended the run (UnicodeEncodeError), printed markers became control tokens in the next
prompt, and a bool count or an upper-case name launched a child with no targets that was labelled successful after
finish('done'): execution reward 1.0 in the credit.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "tools"))

import hostile_policy_run as hostile  # noqa: E402

from sera_jax.agents.records import read_jsonl  # noqa: E402


def test_a_hostile_policy_run_finishes_counts_its_failures_and_credits_no_exploit(tmp_path):
    args = argparse.Namespace(steps=2, classes=list(hostile.CLASSES), out=str(tmp_path / "run"))
    report = asyncio.run(hostile.run(args))
    assert report["finished"] and report["crash"] is None, report["crash"]
    attempts = report["attempts"]
    assert len(attempts) == 2 and not any(a["skipped"] for a in attempts)  # both versions trained
    for a in attempts:
        # 2 task groups x (4 malformed launches, 2 cells stopped at a limit); nothing failed the infrastructure
        assert a["invalid_launches"] == 8 and a["cell_limit_stops"] == 4, a
        assert a["infra_failed_trees"] == 0 and a["unrecorded_trees"] == 0 and a["agent_errors"] == 0, a
    assert not report["logs"]

    # Every tree was recorded, as valid UTF-8, with each surrogate repaired (U+FFFD) where it crossed.
    paths = sorted((tmp_path / "run" / "trees").glob("*.jsonl"))
    for path in paths:
        text = path.read_bytes().decode("utf-8")
        assert "\\ud800" not in text.replace("\\\\ud800", "") and "\\udcff" not in text.replace("\\\\udcff", "")
    assert report["trees_recorded"] == sum(1 for p in paths for _ in read_jsonl(p)) == 16

    c = report["classes"]
    assert all(c[name]["trees"] == 4 for name in hostile.CLASSES)
    assert c["print_surrogate"]["rows"][0]["observation"] == "printed \ufffd here\n"
    assert "ValueError: raised \ufffd here" in c["raise_surrogate"]["rows"][0]["observation"]
    assert c["finish_surrogate"]["rows"][0]["finish_message"] == "finished \ufffd here"
    # The printed <|im_end|> / <|im_start|> (2 each) are text in the next prompt, never control tokens.
    assert c["special_tokens"]["rows"][0]["next_prompt"]["markers_as_text"] == 4
    for name in ("bool_count", "case_folded", "smuggled_target", "unknown_item"):
        cls = c[name]
        assert cls["invalid_launches"] == 4 and cls["children"] == 0 and cls["credited_child_rewards"] == [], name
        assert cls["rows"][0]["observation"].startswith("Error: launch_subagent"), name
    assert c["cpu_spin"]["limits"] == ["cpu"] and c["stream_output"]["limits"] == ["output"]
