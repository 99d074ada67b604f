"""What one step's trees say, as scalars: success, delegation, tree shape, rubric calls, supervision spent, and how
well the policy's rubrics ranked real successes above failures at the step's delegation points.

Rubric quality, two views: ``rubric_ranking_accuracy`` / ``rubric_ranking_auc`` over the counterfactual fork groups
(rubric-generation stage: each group's branches scored with its fresh rubric, mean over the ranked groups), and
``subagent_score_accuracy`` / ``subagent_score_auc`` over the sub-agents scored during execution steps (every scored
child of the step's trees pooled: its rubric score against its programmatic success), with
``subagent_score_agreement``, the fraction whose score's success flag equals that success.

Supervision spent (``supervision/…``), summed over the step's finished trees (accepted and rejected groups alike:
the supervision was spent either way; groups cancelled in flight left no records and are not counted):

* ``supervision/programmatic_labels`` — counterfactual branches labelled by the programmatic checker (TextCraft);
* ``supervision/judge_labels`` — labels a judge model gave (TextWorld): counterfactual branches plus sub-agents
  given an execution label (RAO family); the ones it failed on are not counted;
* ``supervision/judge_calls`` — requests sent to the judge (every attempt: retries and failed requests included),
  branch and execution labels together;
* ``supervision/judge_prompt_tokens`` / ``supervision/judge_completion_tokens`` — their tokens: the endpoint's
  ``usage`` (chat judge) or the token ids sent and generated (``policy_frozen`` judge);
* ``supervision/judge_unmetered_calls`` — judge requests with no token count (no ``usage`` in the reply, or no
  reply): when non-zero the token sums are lower bounds;
* ``supervision/execution_judge_{labels,failures,calls,prompt_tokens,completion_tokens,unmetered_calls}`` — the
  share of the above spent on the TextWorld RAO family's execution labels (``agents.subagent_judge``: one request
  per non-root node; a failure takes that sub-agent out of training), with the sub-agents it failed on.

What each role spent (``roles/<role>/<backend>/{calls,prompt_tokens,completion_tokens,failures}``, docs/design/roles.md;
roles actor, rubric_writer, scorer, judge, selector; backends policy, frozen, endpoint, file), summed likewise:

* the actor — every agent turn (``endpoint`` for a served actor's turns, else ``policy``), failures = agent errors;
* the rubric writer, the scorer and the selector — the side calls' own records (``agents.roles``: every attempt a
  call, an attempt without a usable reply a failure); a file-backed writer is named with 0 calls;
* the judge — its label records (branch and execution labels; failures = labels it could not give), by the
  backend that answered.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from sera_jax.agents import infra
from sera_jax.agents.env_name import DEFAULT_ENV, EnvName
from sera_jax.agents.environments import environment
from sera_jax.agents.records import Tree, TreeIndex
from sera_jax.agents.roles import SPEND_FIELDS, SPEND_KEY, empty_spend
from sera_jax.agents.subagent_judge import BRANCH_KEY, SPENT_KEY


def ranking_auc(scores: Sequence[float], labels: Sequence[bool]) -> float | None:
    """Returns P(score of a random success > score of a random failure), ties counting 1/2; None without both."""
    s = np.asarray(scores, np.float64)
    y = np.asarray(labels, bool)
    if y.all() or not y.any():
        return None
    gaps = s[y][:, None] - s[~y][None, :]
    return float((gaps > 0).mean() + 0.5 * (gaps == 0).mean())


def pairwise_accuracy(scores: Sequence[float], labels: Sequence[bool]) -> float:
    """Returns the fraction of (success, failure) pairs whose success scores strictly higher (needs both labels)."""
    s = np.asarray(scores, np.float64)
    y = np.asarray(labels, bool)
    return float(((s[y][:, None] - s[~y][None, :]) > 0).mean())


def tree_metrics(trees: Sequence[Tree], *, env: EnvName = DEFAULT_ENV) -> dict[str, float]:
    """Returns step-level scalars of ``trees`` (empty dict for no trees)."""
    if not trees:
        return {}
    programmatic = environment(env).programmatic
    root_success, delegated, nodes, depth, tokens, errors = [], [], [], [], [], []
    rubric = {"rubric_calls": 0, "rubric_invalid": 0, "score_calls": 0, "score_invalid": 0}
    labels = 0
    refused = {"invalid_launches": 0, "cell_limit_stops": 0}  # what the policy's cells tried that the host refused
    judge = {"calls": 0, "prompt_tokens": 0, "completion_tokens": 0, "unmetered_calls": 0}
    execution = {"labels": 0, "failures": 0, **judge}  # the execution judge's share (RAO family, TextWorld)
    aucs, accs = [], []
    child_scores, child_labels, child_flags = [], [], []
    for t in trees:
        idx = TreeIndex.build(t)
        root = t.nodes[idx.root]
        root_success.append(float(root.env_labels.get("success", 0.0) or 0.0))
        stats = t.misc.get("stats", {})
        delegated.append(float(stats.get("delegations", 0) > 0))
        nodes.append(stats.get("nodes", len(t.nodes)))
        depth.append(stats.get("max_depth", max(idx.depth.values(), default=0)))
        tokens.append(stats.get("completion_tokens", 0))
        errors.append(stats.get("agent_errors", 0))
        refused["invalid_launches"] += int(stats.get("invalid_launches", 0))
        refused["cell_limit_stops"] += int(stats.get("cell_limit_stops", 0))
        rs = t.misc.get("rubric_stats", {})
        if "children" in rs:  # execution stage (RubricCoordinator): a rubric per child, a score per valid rubric
            if rs.get("rubric_writer") != "file":  # a fixed rubric file: no rubric call at all
                rubric["rubric_calls"] += int(rs.get("children", 0) or 0)
            rubric["score_calls"] += int(rs.get("scored", 0) or 0) + int(rs.get("score_invalid", 0) or 0)
        else:  # rubric-generation stage (counterfactual collector): a rubric per complete group, a score per branch
            rubric["rubric_calls"] += int(rs.get("complete", rs.get("rubrics", 0)) or 0)
            rubric["score_calls"] += int(rs.get("scores", 0) or 0) + int(rs.get("score_invalid", 0) or 0)
        rubric["rubric_invalid"] += int(rs.get("rubric_invalid", 0) or 0)
        rubric["score_invalid"] += int(rs.get("score_invalid", 0) or 0)
        for node in t.nodes.values():
            if (node.rubric_score is not None and node.parent_id is not None and node.fork_group_id is None
                    and node.env_labels.get("success") is not None):
                child_scores.append(float(node.rubric_score.score))
                child_labels.append(bool(node.env_labels["success"]))
                child_flags.append(bool(node.rubric_score.success))
            spent = node.misc.get(BRANCH_KEY) or {}
            for k in judge:
                judge[k] += int(spent.get(k, 0) or 0)
            spent = node.misc.get(SPENT_KEY)
            if spent:  # an execution label (agents.subagent_judge): counted in the totals and on its own
                labelled = spent.get("success") is not None
                execution["labels" if labelled else "failures"] += 1
                for k in judge:
                    n = int(spent.get(k, 0) or 0)
                    judge[k] += n
                    execution[k] += n
        for g in t.fork_groups:
            labelled = [b for b in g.branches if b.success is not None]
            labels += len(labelled)
            scored = [b for b in labelled if b.score is not None]
            auc = ranking_auc([b.score for b in scored], [bool(b.success) for b in scored])
            if auc is not None:
                aucs.append(auc)
                accs.append(pairwise_accuracy([b.score for b in scored], [bool(b.success) for b in scored]))
    out: dict[str, Any] = {
        **role_spend(trees),
        "root_success": float(np.mean(root_success)), "delegation_rate": float(np.mean(delegated)),
        "nodes_per_tree": float(np.mean(nodes)), "max_depth": float(np.max(depth)),
        "completion_tokens": float(np.sum(tokens)), "agent_errors": float(np.sum(errors)),
        # trees an env worker's or sandbox host's failure ended (agents/infra.py): recorded, not credited
        "infra_failed_trees": float(sum(infra.failed(t) for t in trees)),
        **{k: float(v) for k, v in refused.items()},
        **{k: float(v) for k, v in rubric.items()},
        # Supervision: the environment's labels kind (agents.environments): TextCraft's are programmatic checks,
        # TextWorld's come from the judge.
        "supervision/programmatic_labels": float(labels if programmatic else 0),
        "supervision/judge_labels": float((labels if not programmatic else 0) + execution["labels"]),
        **{f"supervision/judge_{k}": float(v) for k, v in judge.items()},
        **{f"supervision/execution_judge_{k}": float(v) for k, v in execution.items()},
    }
    if aucs:
        out["rubric_ranking_accuracy"] = float(np.mean(accs))
        out["rubric_ranking_auc"] = float(np.mean(aucs))
        out["ranked_groups"] = float(len(aucs))
    if child_scores:
        out["scored_subagents"] = float(len(child_scores))
        out["subagent_score_agreement"] = float(np.mean(np.asarray(child_flags) == np.asarray(child_labels)))
        auc = ranking_auc(child_scores, child_labels)
        if auc is not None:
            out["subagent_score_auc"] = auc
            out["subagent_score_accuracy"] = pairwise_accuracy(child_scores, child_labels)
    return out


ACTOR_SPEND_KEY = "actor_spend"  # tree.misc of a tree gathered without its turns: actor_spend(tree)


def actor_spend(tree: Tree) -> dict[str, dict[str, int]]:
    """Returns the actor's spend in ``tree`` by backend: one call per agent turn (``endpoint`` for a served actor's
    turns), its prompt and completion tokens."""
    out: dict[str, dict[str, int]] = {}
    for node in tree.nodes.values():
        for turn in node.turns:
            served = bool((turn.misc.get("usage") or {}).get("route"))
            rec = out.setdefault("actor/endpoint" if served else "actor/policy", empty_spend())
            rec["calls"] += 1
            rec["prompt_tokens"] += len(turn.prompt_ids)
            rec["completion_tokens"] += len(turn.completion_ids)
    return out


def role_spend(trees: Sequence[Tree]) -> dict[str, float]:
    """Returns ``roles/<role>/<backend>/<field>`` sums over ``trees`` (see the module docstring)."""
    spend: dict[str, dict[str, int]] = {}

    def add(key: str, **fields: int) -> None:
        rec = spend.setdefault(key, empty_spend())
        for k, v in fields.items():
            rec[k] += int(v or 0)

    for t in trees:
        # A multi-host step's gathered trees come without turns (shared_step.light_tree): their summary instead.
        actor = t.misc.get(ACTOR_SPEND_KEY) or actor_spend(t)
        for key, rec in actor.items():
            add(key, **rec)
        for node in t.nodes.values():
            for k in (BRANCH_KEY, SPENT_KEY):
                rec = node.misc.get(k) or {}
                if rec.get("backend") and int(rec.get("calls", 0) or 0):
                    add(f"judge/{rec['backend']}", calls=rec["calls"], prompt_tokens=rec.get("prompt_tokens"),
                        completion_tokens=rec.get("completion_tokens"), failures=rec.get("success") is None)
        errors = int(t.misc.get("stats", {}).get("agent_errors", 0) or 0)
        if errors:
            add("actor/policy", failures=errors)
        for key, rec in (t.misc.get(SPEND_KEY) or {}).items():
            add(key, **{f: rec.get(f, 0) for f in SPEND_FIELDS})
        if (t.misc.get("rubric_stats") or {}).get("rubric_writer") == "file":
            add("rubric_writer/file")
    return {f"roles/{key}/{f}": float(v) for key, rec in sorted(spend.items()) for f, v in rec.items()}
