"""Why do a TextWorld policy's trees fail, and can RL's sampling find the way out?

Reads recorded trees (an evaluation's or a training run's ``trees.jsonl``, gzipped or not) and sorts every tree the
root did not solve by what went wrong:

- ``root acted alone``: the root never delegated (under the tiny default's 10 own turns one agent cannot cook two
  dishes, so this fails for certain);
- ``root stuck after its sub-agents returned``: it delegated, and at least half of its own turns after the
  children returned were invalid actions (typically ``eat dish_1`` repeated while the list offers ``eat dish_2``);
- ``other``.

It also counts the sub-agents' turns the shared world rejected (two children acting on one world from the same
observation take the same action, and the second is refused) and whether a child's first action handles an
ingredient of its own goal, of a sibling's, or neither.

With ``--checkpoint`` (or without, for the config's starting policy: the shipped warm start), the policy under test
scores, at each stuck root's first invalid turn, the reply it sampled and the reply of the warm start's teacher rule
(``textworld_oracle.next_action``: the valid list's last progress action), teacher-forced at temperature 1. A
failure that recurs in every tree of a task carries no RL gradient (every tree of the group ends alike, so every
leave-one-out advantage is 0) unless sampling sometimes takes the other reply: these probabilities say whether it
can. The committed outputs are in ``docs/results/textworld/failures/``.

Usage: python tools/research/textworld_failures.py TREES.jsonl[.gz] [...] [--checkpoint RUN_OR_DIR | --no-model]
       [--config configs/tiny_textworld.yaml] [--json OUT]
"""

from __future__ import annotations

import argparse
import collections
import json
import math
import re
import sys
from pathlib import Path

from sera_jax.agents.records import read_jsonl
from sera_jax.rl.rewards import env_success
from sera_jax.warmstart.textworld_oracle import dish_specs, ingredient_names, next_action, prompt_view

MODES = ("root acted alone", "root stuck after its sub-agents returned", "other")
_ACTION = re.compile(r"<action>(.*?)</action>", re.DOTALL)
_OBJECT = re.compile(r"^(?:take|cook|chop|slice|dice|mince) (.+?)(?: (?:on|in|with) .*)?$")


def _names(goal: str) -> set[str]:
    return {n for _, spec in dish_specs(goal) for n in ingredient_names(spec)}


def first_action_kind(child, sibling_goals) -> str | None:
    """Returns whether a child's first action handles an ingredient of its own goal (``own``), of a sibling's
    (``sibling``) or neither (``neither``), and whether the world accepted it: ``"own, rejected"``; None for a child
    without an action turn."""
    for turn in child.turns:
        m = _ACTION.search(turn.code or "")
        if not m:
            continue
        obj = _OBJECT.match(m.group(1).strip())
        name = obj.group(1) if obj else ""
        kind = ("own" if name in _names(child.goal)
                else "sibling" if any(name in _names(g) for g in sibling_goals) else "neither")
        return f"{kind}, {'rejected' if turn.error else 'accepted'}"
    return None


def tree_view(tree) -> dict:
    """Returns one tree's failure mode and counts (see the module docstring); ``stuck_turn`` is the root's first
    invalid turn after its children returned, when the mode is the stuck one."""
    root = tree.nodes[tree.root_id]
    solved = env_success(root) == 1.0
    delegations = [d for d in tree.delegations if d.parent_id == tree.root_id and d.child_ids]
    post = root.turns[delegations[-1].fork_step + 1:] if delegations else []
    invalid_post = [t for t in post if t.error]
    if solved:
        mode = None
    elif not delegations:
        mode = MODES[0]
    elif post and 2 * len(invalid_post) >= len(post):
        mode = MODES[1]
    else:
        mode = MODES[2]
    pairs = [(d, c) for d in delegations for c in d.child_ids if c in tree.nodes]
    children = [tree.nodes[c] for _, c in pairs]
    kinds = (first_action_kind(tree.nodes[c], [g for g, o in zip(d.goals, d.child_ids) if o != c]) for d, c in pairs)
    first = collections.Counter(k for k in kinds if k)
    return {"solved": solved, "mode": mode,
            "child_turns": sum(len(c.turns) for c in children),
            "child_invalid": sum(bool(t.error) for c in children for t in c.turns),
            "first_action": dict(first),
            "stuck_turn": invalid_post[0] if mode == MODES[1] else None}


def summarise(trees) -> dict:
    """Returns the counts over trees (see the module docstring), and the stuck turns in order."""
    views = [tree_view(t) for t in trees]
    modes = collections.Counter(v["mode"] for v in views if not v["solved"])
    first = collections.Counter()
    for v in views:
        first.update(v["first_action"])
    return {"trees": len(views), "solved": sum(v["solved"] for v in views),
            "failures": {m: modes.get(m, 0) for m in MODES},
            "child_turns": sum(v["child_turns"] for v in views),
            "child_invalid": sum(v["child_invalid"] for v in views),
            "first_action": {f"{k}, {a}": first.get(f"{k}, {a}", 0)
                             for k in ("own", "sibling", "neither") for a in ("accepted", "rejected")},
            "stuck_turns": [v["stuck_turn"] for v in views if v["stuck_turn"] is not None]}


def rule_reply(turn, decode) -> str:
    """Returns the teacher rule's reply at ``turn``'s prompt."""
    _, _, observation, valid = prompt_view(decode(turn.prompt_ids))
    return f"<action>{next_action(valid, observation)}</action>"


def reply_probabilities(policy, turns) -> list[tuple[float, float]]:
    """Returns (P(sampled reply), P(the rule's reply)) at each turn, teacher-forced at temperature 1; the end token
    is left out of both (the sampled reply's last token when it is the tokenizer's end of turn)."""
    import jax.numpy as jnp
    import numpy as np

    from sera_jax.model.logprobs import token_logprobs
    from sera_jax.model.tokenizer import IM_END

    tok = policy.tokenizer

    def logp(prompt, completion) -> float:
        ids = list(prompt) + list(completion)
        width = 1 << max(len(ids) - 1, 1).bit_length()
        x = np.zeros((1, width), np.int32)
        x[0, :len(ids)] = ids
        y = np.zeros((1, width), np.int32)
        y[0, :len(ids) - 1] = ids[1:]
        out = np.asarray(token_logprobs(policy.params, policy.model_cfg, jnp.asarray(x), jnp.asarray(y)))[0]
        return float(out[len(prompt) - 1:len(ids) - 1].sum())

    rows = []
    for t in turns:
        sampled = list(t.completion_ids)
        if sampled and tok.decode(sampled[-1:]) == IM_END:
            sampled = sampled[:-1]
        rule = tok.encode(rule_reply(t, tok.decode), add_special_tokens=False)
        rows.append((math.exp(logp(t.prompt_ids, sampled)), math.exp(logp(t.prompt_ids, rule))))
    return rows


def _quantiles(values) -> dict:
    import numpy as np

    if not values:
        return {}
    q = np.quantile(np.asarray(values), [0.1, 0.5, 0.9])
    return {"p10": float(q[0]), "median": float(q[1]), "p90": float(q[2])}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("trees", nargs="+")
    ap.add_argument("--config", default="configs/tiny_textworld.yaml")
    ap.add_argument("--checkpoint", default=None, help="run directory or checkpoint (default: the config's start)")
    ap.add_argument("--no-model", action="store_true", help="counts only; score no replies")
    ap.add_argument("--json", default=None)
    args = ap.parse_args(argv)

    trees = [t for p in args.trees for t in read_jsonl(p)]
    s = summarise(trees)
    failed = s["trees"] - s["solved"]
    print(f"{s['trees']} trees, {s['solved']} solved, {failed} failed")
    print("| failure mode | trees | of the failures |\n|---|---|---|")
    for mode, n in s["failures"].items():
        print(f"| {mode} | {n} | {n / max(failed, 1):.0%} |")
    ct, ci = s["child_turns"], s["child_invalid"]
    print(f"sub-agent turns rejected by the world: {ci} of {ct} ({ci / max(ct, 1):.0%})")
    print(f"sub-agents' first action, on an ingredient of: {s['first_action']}")
    out = {k: v for k, v in s.items() if k != "stuck_turns"}
    if not args.no_model and s["stuck_turns"]:
        from sera_jax.config import load_config
        from sera_jax.evaluation.protocol import load_policy

        policy = load_policy(load_config([args.config]), checkpoint=args.checkpoint)
        probs = reply_probabilities(policy, s["stuck_turns"])
        out["stuck_reply_probability"] = {"policy": policy.source, "turns": len(probs),
                                          "sampled": _quantiles([a for a, _ in probs]),
                                          "rule": _quantiles([b for _, b in probs])}
        print(f"stuck roots' first invalid turn ({len(probs)}; {policy.source}), probability at temperature 1:")
        for key in ("sampled", "rule"):
            q = out["stuck_reply_probability"][key]
            print(f"  {key} reply: median {q['median']:.3g} (10%-90%: {q['p10']:.3g}-{q['p90']:.3g})")
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
