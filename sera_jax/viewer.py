"""Tree records → one static HTML page (``sera-view``): every tree, its nodes nested by parent, their turns,
rubrics, scores, labels, rewards and (given) advantages; collapsible and searchable, with no server and nothing
loaded from elsewhere (CSS and JS are inline).

Everything a model wrote is untrusted. All record text goes through ``html.escape`` (quotes included); the one
JSON block the script reads is escaped so that ``<``, ``>`` and ``&`` never appear raw in it (``</script>`` in a
goal cannot close the block). As a second wall, the page's Content-Security-Policy allows exactly one script, by
its SHA-256 hash: an injected ``<script>`` or ``onerror=`` attribute would not run even if escaping failed.

The page honours a URL fragment: ``report.html#q=TEXT`` runs the search for TEXT (hits get ``class="hit"`` and
``<mark>`` around the match, their ``<details>`` and ancestors are opened), and ``#open=NODE_ID`` (optionally
``&tree=INDEX``) opens that node and its ancestors and marks it ``focus``.
"""

from __future__ import annotations

import base64
import hashlib
import html
import json
from collections.abc import Iterable, Mapping
from typing import Any

from sera_jax.agents.records import DelegationPoint, ForkGroup, Node, Reward, Tree, TreeIndex, Turn

__all__ = ["render_html", "script_json", "esc"]


def esc(value: Any) -> str:
    """Returns ``str(value)`` HTML-escaped, quotes included (safe in text and in quoted attributes)."""
    return html.escape("" if value is None else str(value), quote=True)


def script_json(obj: Any) -> str:
    """Returns JSON for an inline ``<script type="application/json">`` block: ``<``, ``>``, ``&`` and the JS
    line separators are written as ``\\uXXXX`` escapes, so no string in ``obj`` can end the block."""
    text = json.dumps(obj, ensure_ascii=False, sort_keys=True, default=str)
    for ch, rep in (("&", "\\u0026"), ("<", "\\u003c"), (">", "\\u003e"), ("\u2028", "\\u2028"),
                    ("\u2029", "\\u2029")):
        text = text.replace(ch, rep)
    return text


def _fmt(x: Any) -> str:
    if x is None:
        return "—"
    if isinstance(x, float):
        return f"{x:.4g}"
    return str(x)


def _pre(label: str, text: Any, cls: str = "") -> str:
    if text is None or text == "" or text == {} or text == []:
        return ""
    if not isinstance(text, str):
        text = json.dumps(text, indent=1, ensure_ascii=False, sort_keys=True, default=str)
    return f'<div class="field {cls}"><span class="k">{esc(label)}</span><pre>{esc(text)}</pre></div>'


def _fold(label: str, obj: Any) -> str:
    """A collapsed block for bulky JSON (misc dicts): open on click, or when a search hit lies inside."""
    inner = _pre("", obj)
    return f'<details class="misc"><summary>{esc(label)}</summary>{inner}</details>' if inner else ""


def _kv(pairs: Iterable[tuple[str, Any]]) -> str:
    cells = "".join(f'<span class="kv"><span class="k">{esc(k)}</span> {esc(_fmt(v))}</span>'
                    for k, v in pairs if v is not None and v != "" and v != {})
    return f'<div class="kvs">{cells}</div>' if cells else ""


def _table(rows: list[Mapping[str, Any]], cols: list[str]) -> str:
    head = "".join(f"<th>{esc(c)}</th>" for c in cols)
    body = "".join("<tr>" + "".join(f"<td>{esc(_fmt(r.get(c, '')))}</td>" for c in cols) + "</tr>" for r in rows)
    return f"<table><tr>{head}</tr>{body}</table>"


def _rubric(rubric: Any, label: str = "rubric") -> str:
    """Rubric items as a table (docs/design/algorithm.md §3.2 schema), the rest of the rubric as JSON."""
    if not isinstance(rubric, Mapping):
        return _pre(label, rubric, "rubric")
    items = rubric.get("rubric_items")
    out = [f'<div class="rubric"><span class="k">{esc(label)}</span>']
    if isinstance(items, list) and all(isinstance(i, Mapping) for i in items):
        out.append(_table(list(items), ["name", "weight", "description", "score_0", "score_full"]))
        rest = {k: v for k, v in rubric.items() if k != "rubric_items"}
    else:
        rest = dict(rubric)
    out.append(_pre("", rest) if rest else "")
    return "".join(out) + "</div>"


def _score_payload(payload: Any) -> str:
    if not isinstance(payload, Mapping):
        return _pre("score payload", payload)
    crit = payload.get("criterion_scores")
    out = ['<div class="score"><span class="k">score payload</span>']
    if isinstance(crit, list) and all(isinstance(c, Mapping) for c in crit):
        out.append(_table(list(crit), ["name", "score", "reason"]))
    out.append(_pre("", {k: v for k, v in payload.items() if k != "criterion_scores"}))
    return "".join(out) + "</div>"


def _reward(r: Reward) -> str:
    """Returns the graded parts of a node's reward ("env 1 · judge 0"), "" when nothing graded it."""
    parts = [("env", r.environment), ("judge", r.judge), ("rubric", r.rubric_score)]
    return " · ".join(f"{k} {_fmt(v)}" for k, v in parts if v is not None)


def _turn(t: Turn, label: str = "turn") -> str:
    flags = " error" if t.error else ""
    summary = (f"{esc(label)} {t.index} · v{t.policy_version} · {len(t.completion_ids)} tokens · "
               f"reward {esc(_fmt(t.reward))}" + (" · <b>error</b>" if t.error else "")
               + (" · synthetic" if t.completion_id is None else ""))
    body = [_pre("thought", t.thought, "thought"), _pre("action", t.code, "action"),
            _pre("observation / output", t.output, "output"), _pre("error", t.error, "err"),
            _kv([("prompt tokens", len(t.prompt_ids)), ("completion id", t.completion_id)]),
            _fold("reward misc", t.reward_misc)]
    extra = _pre("completion text (raw)", t.completion_text) + _pre("misc", t.misc)
    if extra:
        body.append(f'<details class="raw"><summary>raw completion and misc</summary>{extra}</details>')
    return f'<details class="turn{flags}"><summary>{summary}</summary>{"".join(body)}</details>'


def _node(tree_i: int, node_i: dict[str, int], tree: Tree, idx: TreeIndex, nid: str,
          adv: float | None) -> str:
    n: Node = tree.nodes[nid]
    rs = n.rubric_score
    bits = [f'<span class="nid">{esc(nid)}</span>', f"depth {idx.depth[nid]}", f"{len(n.turns)} turns"]
    if _reward(n.reward):
        bits.append(f"reward {esc(_reward(n.reward))}")
    if "success" in n.env_labels:
        bits.append(f"label {esc(_fmt(n.env_labels['success']))}")
    if rs is not None:
        bits.append(f"rubric score {esc(_fmt(rs.score))}")
    if adv is not None:
        bits.append(f"advantage {esc(_fmt(adv))}")
    if n.branch_index is not None:
        bits.append(f"branch {n.branch_index} of {esc(n.fork_group_id)}")
    if n.error_message or n.rollout_error_zero_reward:
        bits.append("<b>error</b>")
    if n.skip_gradient_update:
        bits.append("skip-grad")
    goal_line = n.goal.strip().splitlines()[0][:140] if n.goal.strip() else ""
    summary = " · ".join(bits) + f' <span class="goal">{esc(goal_line)}</span>'
    body = [_pre("goal", n.goal, "goalfull"),
            _kv([("task", n.task_id), ("max steps", n.max_steps), ("parent", n.parent_id),
                 ("fork step", n.fork_step), ("reward", _reward(n.reward) or None), ("advantage (root LOO)", adv)]),
            _pre("env labels", n.env_labels), _pre("finish message", n.finish_message),
            _pre("error message", n.error_message, "err")]
    if rs is not None:
        body.append(_kv([("rubric score", rs.score), ("success", rs.success),
                         ("original binary reward", rs.original_binary_reward)]))
        body.append(_rubric(rs.rubric))
        body.append(_score_payload(rs.score_payload))
    body += [_fold("task misc", n.task_misc), _fold("node misc", n.misc)]
    body += [_turn(t) for t in n.turns]
    kids = "".join(_node(tree_i, node_i, tree, idx, c, None) for c in idx.children[nid])
    num = node_i.setdefault(nid, len(node_i))
    return (f'<details class="node unit" id="t{tree_i}-n{num}" data-node="{esc(nid)}" data-tree="{tree_i}">'
            f'<summary>{summary}</summary><div class="body">{"".join(body)}</div>'
            f'<div class="children">{kids}</div></details>')


def _delegation(d: DelegationPoint) -> str:
    summary = f"{esc(d.kind)} · parent {esc(d.parent_id)} step {d.fork_step} · {len(d.child_ids)} children"
    body = [_kv([("children", ", ".join(d.child_ids)), ("fork group", d.fork_group_id)]),
            _pre("goals", "\n---\n".join(d.goals)), _pre("context", d.context),
            _pre("result (what the parent got)", d.result), _fold("misc", d.misc)]
    return (f'<details class="deleg unit"><summary>{summary}</summary>'
            f'<div class="body">{"".join(body)}</div></details>')


def _fork_group(g: ForkGroup) -> str:
    summary = (f"fork group {esc(g.id)} · parent {esc(g.parent_id)} step {g.fork_step} · "
               f"{len(g.branches)} branches" + (" · <b>skipped</b>" if g.skipped else "")
               + (" · no rubric" if g.rubric is None else ""))
    rows = [{"branch": b.branch_index, "trajectory": b.trajectory_id, "label (success)": b.success,
             "score": b.score, "reward": b.reward, "selected": b.selected,
             "finish / error": b.finish_message or b.error_message or ""} for b in g.branches]
    body = [_pre("goal", g.goal),
            _table(rows, ["branch", "trajectory", "label (success)", "score", "reward", "selected",
                          "finish / error"]),
            _rubric(g.rubric) if g.rubric is not None else ""]
    if g.rubric_turn is not None:
        body.append(_turn(g.rubric_turn, "rubric turn"))
    body += [_turn(t, "score turn") for t in g.score_turns]
    return (f'<details class="group unit"><summary>{summary}</summary>'
            f'<div class="body">{"".join(body)}</div></details>')


def _tree(i: int, tree: Tree, adv: float | None) -> str:
    idx = TreeIndex.build(tree)
    root = tree.nodes.get(tree.root_id)
    reward = root.reward.environment if root is not None else None
    summary = (f"tree {i}: {esc(tree.id)} · task {esc(tree.task_id)} · stage {esc(_fmt(tree.stage))} · "
               f"policy v{esc(_fmt(tree.policy_version))} · {len(tree.nodes)} nodes · root reward {esc(_fmt(reward))}"
               + (f" · advantage {esc(_fmt(adv))}" if adv is not None else ""))
    node_i: dict[str, int] = {}
    nodes = "".join(_node(i, node_i, tree, idx, r, adv if r == tree.root_id else None) for r in idx.roots)
    parts = [_kv([("rollout index", tree.root_rollout_index), ("envs created", tree.counterfactual_environment_count)]),
             _fold("tree misc", tree.misc), nodes]
    if tree.delegations:
        parts.append(f'<details class="section"><summary>delegations ({len(tree.delegations)})</summary>'
                     + "".join(_delegation(d) for d in tree.delegations) + "</details>")
    if tree.fork_groups:
        parts.append(f'<details class="section"><summary>fork groups ({len(tree.fork_groups)})</summary>'
                     + "".join(_fork_group(g) for g in tree.fork_groups) + "</details>")
    return (f'<details class="tree" id="t{i}" data-tree="{i}"><summary>{summary}</summary>'
            f'{"".join(parts)}</details>')


CSS = """
body{font:14px/1.4 system-ui,sans-serif;margin:0;background:#fafafa;color:#222}
header{position:sticky;top:0;background:#fff;border-bottom:1px solid #ccc;padding:8px 12px;z-index:1}
header input{width:28em;font-size:14px;padding:3px}
main{padding:8px 12px}
details{margin:3px 0 3px 14px;border-left:2px solid #ddd;padding-left:6px}
details.tree{margin-left:0;border-left:3px solid #789;background:#fff}
summary{cursor:pointer}
.node>summary .nid{font-weight:600}
.goal{color:#555}
pre{white-space:pre-wrap;word-break:break-word;background:#f3f3f3;margin:2px 0;padding:4px;max-height:30em;
 overflow:auto}
.k{color:#666;font-size:12px}.kvs{display:flex;flex-wrap:wrap;gap:12px}
.err pre,.turn.error>summary{color:#a00}
table{border-collapse:collapse;margin:3px 0}td,th{border:1px solid #ccc;padding:2px 5px;vertical-align:top}
.hit>summary{background:#fff3a0}.miss>summary{opacity:.45}.focus>summary{outline:2px solid #36c}
.hidden{display:none}mark{background:#ffd54a}
"""

JS = r"""
(function(){
  var data = JSON.parse(document.getElementById('sera-data').textContent);
  var q = document.getElementById('q'), count = document.getElementById('count');
  function openUp(el){ for(var e=el; e; e=e.parentElement){ if(e.tagName==='DETAILS') e.open=true; } }
  function ownParts(u){ return Array.prototype.filter.call(u.children, function(c){
    return c.tagName==='SUMMARY' || c.classList.contains('body'); }); }
  function clearMarks(){
    document.querySelectorAll('mark').forEach(function(m){
      var p=m.parentNode; p.replaceChild(document.createTextNode(m.textContent), m); p.normalize(); });
    document.querySelectorAll('.hit,.miss,.hidden').forEach(function(e){
      e.classList.remove('hit'); e.classList.remove('miss'); e.classList.remove('hidden'); });
  }
  function markIn(root, needle){
    var walker=document.createTreeWalker(root, NodeFilter.SHOW_TEXT), texts=[], n, found=0;
    while((n=walker.nextNode())) texts.push(n);
    texts.forEach(function(t){
      var s=t.nodeValue, low=s.toLowerCase(), at=low.indexOf(needle);
      if(at<0) return;
      var frag=document.createDocumentFragment(), from=0;
      while(at>=0){
        frag.appendChild(document.createTextNode(s.slice(from, at)));
        var m=document.createElement('mark'); m.textContent=s.slice(at, at+needle.length); frag.appendChild(m);
        from=at+needle.length; at=low.indexOf(needle, from); found++;
      }
      frag.appendChild(document.createTextNode(s.slice(from)));
      var parent=t.parentNode; parent.replaceChild(frag, t);
    });
    return found;
  }
  function search(text){
    clearMarks();
    var needle=(text||'').toLowerCase(), hits=0, marks=0;
    if(!needle){ count.textContent=data.trees.length+' trees, '+data.nodes+' nodes'; return; }
    document.querySelectorAll('.unit').forEach(function(u){
      var own=ownParts(u).map(function(p){return p.textContent;}).join('\n').toLowerCase();
      if(own.indexOf(needle)>=0){
        u.classList.add('hit'); hits++;
        ownParts(u).forEach(function(p){ marks+=markIn(p, needle); });
      } else u.classList.add('miss');
    });
    document.querySelectorAll('mark').forEach(openUp);
    document.querySelectorAll('details.tree').forEach(function(t){
      if(!t.querySelector('.hit')) t.classList.add('hidden'); });
    count.textContent=hits+' matching items, '+marks+' matches';
  }
  function focusNode(id, tree){
    var found=null;
    document.querySelectorAll('details.node').forEach(function(d){
      if(d.dataset.node===id && (tree===null || d.dataset.tree===tree) && !found) found=d; });
    if(found){ openUp(found); found.classList.add('focus'); found.scrollIntoView(); }
    return found;
  }
  function fromHash(){
    var p=new URLSearchParams(location.hash.replace(/^#/, ''));
    if(p.has('q')){ q.value=p.get('q'); }
    search(q.value);
    if(p.has('open')) focusNode(p.get('open'), p.get('tree'));
  }
  var timer=null;
  q.addEventListener('input', function(){ clearTimeout(timer); timer=setTimeout(function(){search(q.value);}, 150); });
  document.getElementById('expand').addEventListener('click', function(){
    document.querySelectorAll('details').forEach(function(d){ d.open=true; }); });
  document.getElementById('collapse').addEventListener('click', function(){
    document.querySelectorAll('details').forEach(function(d){ d.open=false; }); });
  window.addEventListener('hashchange', fromHash);
  fromHash();
})();
"""


def render_html(trees: Iterable[Tree], *, title: str = "SERA trees",
                advantages: Mapping[str, float] | None = None) -> str:
    """Returns the whole report page (one self-contained HTML string) for ``trees``.

    ``advantages`` maps a tree id to its root's advantage (e.g. the execution stage's leave-one-out over the
    tree's task group); shown on the tree and its root node when given.
    """
    trees = list(trees)
    adv = dict(advantages or {})
    body = "".join(_tree(i, t, adv.get(t.id)) for i, t in enumerate(trees))
    data = {"trees": [{"id": t.id, "task_id": t.task_id, "nodes": len(t.nodes)} for t in trees],
            "nodes": sum(len(t.nodes) for t in trees), "title": title}
    digest = base64.b64encode(hashlib.sha256(JS.encode("utf-8")).digest()).decode("ascii")
    csp = f"default-src 'none'; style-src 'unsafe-inline'; script-src 'sha256-{digest}'; img-src data:"
    return ("<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
            f'<meta http-equiv="Content-Security-Policy" content="{esc(csp)}">'
            f"<title>{esc(title)}</title><style>{CSS}</style></head><body>"
            f'<header><b>{esc(title)}</b> <input id="q" type="search" placeholder="search goals, actions, '
            f'outputs, rubrics…" aria-label="search"> <button id="expand">expand all</button> '
            f'<button id="collapse">collapse all</button> <span id="count"></span></header>'
            f"<main>{body or '<p>no trees</p>'}</main>"
            f'<script type="application/json" id="sera-data">{script_json(data)}</script>'
            f"<script>{JS}</script></body></html>\n")
