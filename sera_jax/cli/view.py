"""``sera-view``: tree records (JSONL) → one static HTML page.

Also runnable without the installed script: ``python -m sera_jax.cli.view ARGS``.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from sera_jax.agents.records import TreeIndex, read_jsonl
from sera_jax.cli.common import report_user_error
from sera_jax.config import UserError
from sera_jax.rl.baselines import loo_advantages
from sera_jax.rl.rewards import env_success
from sera_jax.viewer import render_html


def _root_advantages(trees) -> dict[str, float]:
    """Execution-stage root advantages: each root's env success minus the mean of the other roots of its task
    (``rl.baselines.loo_advantages``; 0 for a task with one tree)."""
    if not trees:
        return {}
    values = [env_success(t.nodes[TreeIndex.build(t).roots[0]]) for t in trees]
    adv = loo_advantages(values, [t.task_id for t in trees])
    return {t.id: float(a) for t, a in zip(trees, adv)}


def main(argv: list[str] | None = None) -> int:
    """``sera-view trees.jsonl [-o report.html]``: writes the static tree report; returns the exit status."""
    p = argparse.ArgumentParser(prog="sera-view", description=(
        "Render tree records (JSONL, one tree per line) as one static HTML page: nodes nested by parent, goals, "
        "turns (thought, action, observation, errors), rubrics, scores, labels, rewards and the execution-stage "
        "root advantage; collapsible and searchable. Open it in a browser: report.html#q=TEXT searches, "
        "#open=NODE_ID opens a node."))
    p.add_argument("trees", nargs="+", help="tree JSONL files")
    p.add_argument("-o", "--output", default="report.html", help="output HTML file (default report.html)")
    p.add_argument("--title", default=None, help="page title (default: the input file names)")
    p.add_argument("--no-advantages", action="store_true", help="do not compute root leave-one-out advantages")
    args = p.parse_args(argv)
    for path in args.trees:
        if not Path(path).is_file():
            return report_user_error("sera-view", UserError(f"no tree file at {path}"))
    trees = [t for path in args.trees for t in read_jsonl(path)]
    adv = None if args.no_advantages else _root_advantages(trees)
    page = render_html(trees, title=args.title or "SERA trees: " + ", ".join(Path(x).name for x in args.trees),
                       advantages=adv)
    Path(args.output).write_text(page, encoding="utf-8")
    print(json.dumps({"output": args.output, "trees": len(trees), "nodes": sum(len(t.nodes) for t in trees),
                      "bytes": len(page.encode("utf-8"))}))
    return 0



if __name__ == "__main__":
    sys.exit(main())
