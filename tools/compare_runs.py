"""Hold one training run to another: the trees both hold, token for token, and their step metrics side by side.

    python tools/compare_runs.py RUN_A RUN_B [--keys loss,grad_norm] [--json OUT]

A tree is identified by (policy version, stage, task, root rollout index); its tokens are every turn's prompt and
completion ids of every node (the behaviour logprobs' largest gap is reported beside). Trees one run holds and the other does not (a speculative group
that ran on one side only, a group cancelled at the end of a step) are counted, not compared. Step metrics are
matched by (version, kind, attempt order). Reads tree files of any process count (``trees/v*_*.jsonl`` and the
``.p<i>`` parts of a multi-host run). Exit status 0 when every shared tree is identical and every metric within
``--atol``; 1 otherwise.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from sera_jax.agents.records import read_jsonl


def tree_tokens(tree) -> list:
    """Returns a tree's tokens in a stable order: per node id, each turn's prompt and completion ids."""
    return [(nid, t.index, t.prompt_ids, t.completion_ids, t.policy_version)
            for nid in sorted(tree.nodes) for t in tree.nodes[nid].turns]


def logprob_gap(a, b) -> float:
    """Returns the largest |difference| between two token-identical trees' behaviour logprobs (an engine's batch
    composition changes its programs' shapes, and so the last bits of a logprob, never a sampled token here)."""
    gap = 0.0
    for nid in a.nodes:
        for x, y in zip(a.nodes[nid].turns, b.nodes[nid].turns):
            gap = max([gap] + [abs(p - q) for p, q in zip(x.logprobs, y.logprobs)])
    return gap


def load_trees(run: Path) -> dict[tuple, object]:
    """Returns the run's trees by (policy version, stage, task, root rollout index)."""
    trees = {}
    for f in sorted((run / "trees").glob("v*.jsonl")):
        for t in read_jsonl(f):
            trees[(t.policy_version, t.stage, t.task_id, t.root_rollout_index)] = t
    return trees


def load_steps(run: Path) -> list[dict]:
    """Returns the run's step records (metrics.jsonl, kind "step")."""
    path = run / "metrics.jsonl"
    return [r for r in (json.loads(x) for x in path.read_text().splitlines() if x.strip()) if r.get("kind") == "step"]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("a", type=Path)
    p.add_argument("b", type=Path)
    p.add_argument("--keys", default="loss,grad_norm,update_norm,tokens,trainable_datums,root_success")
    p.add_argument("--atol", type=float, default=1e-5)
    p.add_argument("--json", type=Path, default=None)
    args = p.parse_args(argv)
    ta, tb = load_trees(args.a), load_trees(args.b)
    shared = sorted(set(ta) & set(tb), key=str)
    same = [k for k in shared if tree_tokens(ta[k]) == tree_tokens(tb[k])]
    differ = [k for k in shared if k not in set(same)]
    gap = max((logprob_gap(ta[k], tb[k]) for k in same), default=0.0)
    sa, sb = load_steps(args.a), load_steps(args.b)
    rows, worst = [], 0.0
    for ra, rb in zip(sa, sb):
        row = {"version": ra["version"], "stage": ra.get("stage")}
        for k in args.keys.split(","):
            va, vb = ra.get(k), rb.get(k)
            row[k] = (va, vb)
            if isinstance(va, (int, float)) and isinstance(vb, (int, float)) and k in ("loss", "grad_norm",
                                                                                        "update_norm"):
                worst = max(worst, abs(va - vb))
        rows.append(row)
    out = {"a": str(args.a), "b": str(args.b), "trees_a": len(ta), "trees_b": len(tb), "shared": len(shared),
           "identical": len(same), "different": [list(map(str, k)) for k in differ],
           "only_a": len(set(ta) - set(tb)), "only_b": len(set(tb) - set(ta)), "steps": rows,
           "max_abs_diff_loss_grad_update": worst, "max_abs_diff_behaviour_logprob": gap}
    print(f"trees: {len(ta)} in A, {len(tb)} in B; {len(shared)} in both, {len(same)} token-identical, "
          f"{len(differ)} different; {out['only_a']} only in A, {out['only_b']} only in B; behaviour logprobs of "
          f"the identical ones within {gap:.2g}")
    for r in rows:
        print("  " + json.dumps(r))
    print(f"max |A - B| over loss, grad_norm, update_norm: {worst:.3g} (atol {args.atol:g})")
    if args.json is not None:
        args.json.write_text(json.dumps(out, indent=1) + "\n")
    return 0 if not differ and worst <= args.atol and len(sa) == len(sb) else 1


if __name__ == "__main__":
    sys.exit(main())
