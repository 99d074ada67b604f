"""sera-view: a real TextCraft tree (scripted policy through the real runtime, a rubric score applied, a fork group)
with hostile model text renders to one static page; escaping unit tests; and the page in headless chromium: it
renders, a node opens, search finds a rubric item, and injected markup does not execute."""

from __future__ import annotations

import asyncio
import dataclasses
import html
import json
import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from sera_jax.agents.records import Branch, ForkGroup, Node, Tree, Turn, read_jsonl, write_jsonl
from sera_jax.viewer import render_html, script_json

HOSTILE_SCRIPT = "<script>document.title='pwned'</script>"
HOSTILE_IMG = "<img src=x onerror=\"document.title='pwned-img'\">"
BREAKOUT = "</script><script>document.title='pwned-json'</script>"
RUBRIC_TERM = "zebra-quartz"  # appears only in one rubric item's description
GROUP_TERM = "walrus-ochre"  # appears only in a fork group's rubric
C1 = "root/subagent-1-0"  # launched at the root's step 1
C2 = C1 + "/subagent-0-0"


def py(code: str, thought: str = "next") -> str:
    return f"<thought>{thought}</thought>\n<python>{code}</python>"


DELEGATE = py("r = await launch_subagent({'o3_i1': 4}, 'two raw_o5 per four')\nprint(r)", "delegate")
SCRIPT = {
    "root": [py(f"print({HOSTILE_IMG!r})", f"look {HOSTILE_SCRIPT}"), DELEGATE,
             py("print(craft({'raw_o7': 1, 'o3_i1': 1}, ('o5_i2_15', 3)))\nfinish('root done')")],
    C1: [DELEGATE, py("finish('child 1 done')")],
    C2: [py("print(craft({'raw_o5': 2}, ('o3_i1', 4)))\nfinish('made 4 o3_i1')")],
}


def build_tree(tmp_path: Path) -> Tree:
    """A real tree from the runtime, then a rubric score on the child and a fork group, as the launchers write them."""
    from envs_py.textcraft import load_tasks
    from sera_jax.agents.rubric import Score
    from sera_jax.agents.launchers.rubric import apply_score
    from sera_jax.agents.runtime import run_tree
    from sera_jax.agents.scripted import ScriptedGenerator
    from sera_jax.agents.settings import RuntimeSettings
    from sera_jax.model.tokenizer import load_tokenizer
    from tests.model.tokenizer_fixtures import build_qwen_like_tokenizer

    tok = load_tokenizer(build_qwen_like_tokenizer(tmp_path / "tok"))
    task = load_tasks("val")[0]
    tree = asyncio.run(run_tree(task, "textcraft", ScriptedGenerator(tok, SCRIPT, policy_version=3), tok,
                                RuntimeSettings.for_env("textcraft")))
    rubric = {"rubric_items": [
        {"name": "delivers", "weight": 0.7, "description": f"{RUBRIC_TERM}: returns exactly 4 o3_i1",
         "score_0": "nothing crafted", "score_full": "4 o3_i1 in the inventory"},
        {"name": "honest", "weight": 0.3, "description": f"reports truthfully {HOSTILE_SCRIPT}",
         "score_0": "fabricates", "score_full": "no fabrication"}],
        "success_gate": "o3_i1 crafted", "failure_conditions": ["crafts the wrong item"],
        "scoring_procedure": "weighted sum"}
    payload = {"success": True, "final_score": 0.85, "reason": f"fine {HOSTILE_IMG}",
               "criterion_scores": [{"name": "delivers", "score": 1.0, "reason": "made them"}]}
    apply_score(tree.nodes[C1], Score(0.85, True, payload), rubric)
    turn = Turn(index=0, prompt_ids=[1, 2], completion_ids=[5], logprobs=[-0.5], policy_version=3,
                completion_id="c-r", completion_text=f'{{"success_gate": "{GROUP_TERM}"}}')
    group = ForkGroup(id="fg-0", parent_id="root", fork_step=1, child_depth=1, goal=f"craft 4 o3_i1 {BREAKOUT}",
                      branches=[Branch(b, f"{C1}#b{b}", 1, reward=float(b % 2), success=bool(b % 2),
                                       score=0.1 * b, selected=b == 0) for b in range(8)],
                      rubric_turn=turn, rubric={"rubric_items": [], "success_gate": GROUP_TERM})
    tree.fork_groups.append(group)
    return dataclasses.replace(tree, id=f"tree-1 {BREAKOUT}")


@pytest.fixture(scope="module")
def report(tmp_path_factory):
    """Returns (trees.jsonl path, report.html path, tree): the tree file written, then rendered by sera-view."""
    from sera_jax.cli.view import main as view_main

    d = tmp_path_factory.mktemp("viewer")
    tree = build_tree(d)
    jsonl = d / "trees.jsonl"
    second = dataclasses.replace(tree, id="tree-2", root_rollout_index=1)
    second.nodes = {k: dataclasses.replace(v, turns=list(v.turns)) for k, v in tree.nodes.items()}
    second.nodes["root"].turns[-1] = dataclasses.replace(second.nodes["root"].turns[-1],
                                                        reward_misc={"reward/success": 0.0})
    second.nodes["root"].reward = dataclasses.replace(second.nodes["root"].reward, environment=0.0)
    write_jsonl([tree, second], jsonl)
    out = d / "report.html"
    assert view_main([str(jsonl), "-o", str(out), "--title", "viewer test"]) == 0
    return jsonl, out, tree


# ------------------------------------------------------------------------------------------------ pure HTML


def test_script_json_cannot_close_a_script_block():
    text = script_json({"a": BREAKOUT, "b": "x & y <!-- \u2028"})
    assert "<" not in text and ">" not in text and "&" not in text and "\u2028" not in text
    assert json.loads(text) == {"a": BREAKOUT, "b": "x & y <!-- \u2028"}


def test_model_text_is_escaped_everywhere(report):
    _, out, tree = report
    page = out.read_text()
    # Exactly our two script elements; no raw markup from the records survives.
    assert page.count("<script") == 2 and page.count("</script>") == 2
    for raw in (HOSTILE_SCRIPT, HOSTILE_IMG, "<img", "onerror=\"", BREAKOUT):
        assert raw not in page, raw
    assert html.escape(HOSTILE_SCRIPT, quote=True) in page
    assert html.escape("onerror=\"document.title='pwned-img'\"", quote=True) in page
    # An attribute value holding quotes cannot end the attribute.
    node = Node(id="x\" onmouseover=\"alert(1)", goal="g")
    one = render_html([Tree(id="t", task_id="k", root_id=node.id, nodes={node.id: node})])
    assert 'data-node="x&quot; onmouseover=&quot;alert(1)"' in one and 'onmouseover="' not in one


def test_page_shows_the_tree(report):
    jsonl, out, tree = report
    page = out.read_text()
    back = list(read_jsonl(jsonl))
    assert len(back) == 2 and set(back[0].nodes) == {"root", C1, C2}
    for nid in ("root", C1, C2):
        assert f'data-node="{nid}"' in page
    # Nesting follows parent links: C2's element lies inside C1's, which lies inside root's.
    assert page.index('data-node="root"') < page.index(f'data-node="{C1}"') < page.index(f'data-node="{C2}"')
    assert "rubric score 0.85" in page and RUBRIC_TERM in page and "success_gate" in page
    assert "criterion_scores" not in page.split("score payload")[0]  # payload rendered in its own block
    assert "fork group fg-0" in page and "label (success)" in page and GROUP_TERM in page
    assert "made 4 o3_i1" in page and "two raw_o5 per four" in page
    # Root advantages (leave-one-out over the two trees of the task; env success 1 and 0): +1 and −1.
    assert "advantage 1" in page and "advantage -1" in page
    assert "Content-Security-Policy" in page and "script-src &#x27;sha256-" in page
    # Nothing is fetched from elsewhere.
    assert not re.search(r"(src|href)=\"(https?:)?//", page)


def test_no_trees_renders_a_page():
    page = render_html([])
    assert page.startswith("<!DOCTYPE html>") and "no trees" in page


# ------------------------------------------------------------------------------------------------ a real browser


def chromium_binary() -> str | None:
    """Returns $CHROME_BIN when set, else the first chromium/chrome on PATH, else None."""
    if os.environ.get("CHROME_BIN"):
        return shutil.which(os.environ["CHROME_BIN"])
    for name in ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable", "chrome"):
        path = shutil.which(name)
        if path:
            return path
    return None


def dump_dom(page: Path, fragment: str, tmp_path: Path) -> str:
    """Returns the DOM serialised by headless chromium after the page's scripts ran (``--dump-dom``)."""
    binary = chromium_binary()
    if binary is None:
        print("SKIP reason: no chromium binary on PATH (apt-get install -y chromium)")
        pytest.skip("no chromium binary on PATH (apt-get install -y chromium)")
    url = page.resolve().as_uri() + fragment
    profile = tmp_path / f"profile-{abs(hash(fragment))}"
    cmd = [binary, "--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
           "--disable-background-networking", "--disable-component-update", "--disable-sync", "--no-first-run",
           "--disable-extensions", f"--user-data-dir={profile}", "--virtual-time-budget=2000", "--dump-dom", url]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0 and "<html" in proc.stdout, proc.stderr[-2000:]
    return proc.stdout


def _element(dom: str, node_id: str) -> str:
    """Returns the opening tag of the node element with ``data-node=node_id``."""
    m = re.search(r'<details[^>]*data-node="' + re.escape(html.escape(node_id, quote=True)) + r'"[^>]*>', dom)
    assert m, node_id
    return m.group(0)


def test_browser_renders_and_hostile_text_does_not_run(report, tmp_path):
    _, out, _ = report
    dom = dump_dom(out, "", tmp_path)
    assert re.search(r"<title>viewer test</title>", dom)  # document.title never changed to 'pwned…'
    assert "pwned" not in re.search(r"<title>(.*?)</title>", dom).group(1)
    # Our script ran (it wrote the counter): so the CSP let exactly our script through.
    assert re.search(r'<span id="count">2 trees, 6 nodes</span>', dom), dom[:2000]
    assert "<img" not in dom and dom.count("<script") == 2
    assert html.escape(HOSTILE_SCRIPT, quote=False) in dom  # shown as text
    for nid in ("root", C1, C2):
        assert ' open=""' not in _element(dom, nid)  # collapsed at first


def test_browser_opens_a_node_from_the_url(report, tmp_path):
    _, out, _ = report
    dom = dump_dom(out, f"#open={C2}&tree=0", tmp_path)
    target = _element(dom, C2)
    assert "focus" in target and 'open=""' in target
    # Its ancestors (C1, root, the tree) are open so it is visible; the other tree stays closed.
    for tag in re.findall(r'<details[^>]*data-node="(?:root|' + re.escape(C1) + r')"[^>]*data-tree="0"[^>]*>', dom):
        assert 'open=""' in tag
    assert 'open=""' in re.search(r'<details class="tree[^"]*" id="t0"[^>]*>', dom).group(0)
    assert 'open=""' not in re.search(r'<details class="tree[^"]*" id="t1"[^>]*>', dom).group(0)


def test_browser_search_finds_a_rubric_item(report, tmp_path):
    _, out, _ = report
    dom = dump_dom(out, f"#q={RUBRIC_TERM.upper()}", tmp_path)  # case-insensitive
    assert f"<mark>{RUBRIC_TERM}</mark>" in dom
    hits = re.findall(r'<details class="([^"]*)"[^>]*data-node="([^"]*)"', dom)
    by_node = {}
    for cls, nid in hits:
        by_node.setdefault(nid, []).append(cls)
    assert all("hit" in c and "unit" in c for c in by_node[C1]) and len(by_node[C1]) == 2  # C1 of both trees
    assert all("miss" in c for c in by_node["root"] + by_node[C2])
    # The mark sits in the rubric table and every <details> around it is open.
    head = dom[:dom.index(f"<mark>{RUBRIC_TERM}</mark>")]
    assert head.rfind('class="rubric"') > head.rfind('data-node="')
    assert re.search(r'<span id="count">2 matching items, 2 matches</span>', dom)
    assert 'open=""' in _element(dom, C1)

    dom = dump_dom(out, f"#q={GROUP_TERM}", tmp_path)
    groups = re.findall(r'<details class="group unit ([^"]*)"', dom)
    assert groups == ["hit", "hit"] and f"<mark>{GROUP_TERM}</mark>" in dom


def test_browser_csp_blocks_markup_that_escaped_escaping(report, tmp_path):
    """Second wall: were a raw script or handler ever to reach the page, the CSP (our script's hash only) stops it."""
    _, out, _ = report
    page = out.read_text().replace("<main>", "<main><script>document.title='csp-broken'</script>"
                                   "<img src=x onerror=\"document.title='csp-broken-img'\">", 1)
    broken = tmp_path / "broken.html"
    broken.write_text(page)
    dom = dump_dom(broken, "", tmp_path)
    assert re.search(r"<title>viewer test</title>", dom)
    assert re.search(r'<span id="count">2 trees, 6 nodes</span>', dom)  # our script still ran


def test_browser_interaction_click_expands_and_typed_search_finds_rubric(report, tmp_path):
    """Real input through the DevTools protocol: a mouse click opens a node, typing in the search box finds a
    rubric item (highlighted, visible), and the hostile text never ran."""
    from tests.chromium_cdp import Browser

    binary = chromium_binary()
    if binary is None:
        print("SKIP reason: no chromium binary on PATH (apt-get install -y chromium)")
        pytest.skip("no chromium binary on PATH (apt-get install -y chromium)")
    _, out, _ = report
    b = Browser(binary, tmp_path)
    try:
        b.navigate(out.resolve().as_uri())
        node = "document.querySelector('details.node[data-node=\"root\"][data-tree=\"0\"]')"
        child = f"document.querySelector('details.node[data-node=\"{C1}\"][data-tree=\"0\"]')"
        assert b.evaluate("document.title") == "viewer test"
        assert b.evaluate(f"{node}.open") is False
        b.click("document.querySelector('#t0 > summary')")  # open the tree
        b.click(f"{node}.querySelector(':scope > summary')")  # open the root node
        assert b.evaluate(f"{node}.open") is True and b.evaluate(f"{child}.open") is False
        assert b.evaluate(f"{node}.querySelector(':scope > .body').getBoundingClientRect().height") > 0
        b.click(f"{node}.querySelector(':scope > summary')")  # and close it again
        assert b.evaluate(f"{node}.open") is False

        b.click("document.getElementById('q')")
        b.type_text(RUBRIC_TERM)
        b.wait_for("document.querySelectorAll('mark').length > 0", timeout=10)
        assert b.evaluate("document.getElementById('count').textContent") == "2 matching items, 2 matches"
        assert b.evaluate(f"{child}.classList.contains('hit')") is True
        assert b.evaluate(f"{node}.classList.contains('miss')") is True
        mark = "document.querySelector('mark')"
        assert b.evaluate(f"{mark}.textContent") == RUBRIC_TERM
        assert b.evaluate(f"{mark}.closest('.rubric') !== null && {mark}.closest('details.node') === {child}")
        assert b.evaluate(f"{mark}.getBoundingClientRect().height") > 0  # visible: every ancestor is open
        # Clearing the search removes marks and classes.
        b.evaluate("(function(){var q=document.getElementById('q'); q.value=''; "
                   "q.dispatchEvent(new Event('input'));})()")
        b.wait_for("document.querySelectorAll('mark').length === 0", timeout=10)
        assert b.evaluate("document.querySelectorAll('.hit,.miss,.hidden').length") == 0
        assert b.evaluate("document.title") == "viewer test"
        assert b.evaluate("document.querySelectorAll('img').length") == 0
    finally:
        b.close()
