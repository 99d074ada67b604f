"""Every `docs/<path>.md [§X]` cited outside docs/ names a file in the repo and a heading of that file.

A clone carries only the repository, so a docstring that cites a design note must cite one that is in it. A
heading `## 5. Title` or `### 5.1 Title` defines §5 / §5.1, and `## 1a. Title` defines §1a. Citations may list
sections (`§5, §14`, `§1b/§1c`) or give ranges (`§5-§9`, `§10–12`, `§2.4–2.5`; both ends are checked). The
test also fails on the forms the citations were rewritten from: a note outside the repository, or a design
note under its old name.
"""

from __future__ import annotations

import re
import subprocess
from functools import cache
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SCANNED_SUFFIXES = {".py", ".yaml", ".yml", ".toml", ".sh", ".md"}

_SECTION = r"[0-9]+[a-z]?(?:\.[0-9]+)*"
# A cited path, then optionally its sections: a list joined by ", " or "/", each item a section or a range.
_CITATION = re.compile(
    r"(?P<path>docs/[A-Za-z0-9_./-]+?\.md)"
    rf"(?P<sections>\s*§{_SECTION}(?:\s*[-–]\s*§?{_SECTION})?(?:(?:\s*,\s*|\s*/\s*)§{_SECTION}(?:\s*[-–]\s*§?{_SECTION})?)*)?"
)
_SECTION_TOKEN = re.compile(rf"§?({_SECTION})")
_HEADING = re.compile(rf"^#{{1,6}}\s+({_SECTION})\.?(?:\s|$)")

# The design notes under their names outside the repository; under docs/design/ they have new names.
_OLD_NAMES = ("recipes.md", "sera_algorithm.md", "textcraft_synth.md", "textworld_sync.md", "DESIGN.md")
_STALE = [
    (re.compile(r"\bspec §"), "`spec §` (cite docs/design/<file>.md §X)"),
    (re.compile(r"\.\./shared"), "`../shared` (outside the repository)"),
    *[
        (re.compile(rf"(?<!docs/design/)(?<![\w.-]){re.escape(name)}"), f"bare `{name}`")
        for name in _OLD_NAMES
    ],
]


def _scanned_files() -> list[Path]:
    """Returns the git-tracked files outside docs/ whose suffix may hold a citation (this file excluded)."""
    out = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, check=True, capture_output=True).stdout
    names = [n for n in out.decode().split("\0") if n]
    own = Path(__file__).resolve().relative_to(ROOT).as_posix()
    return [
        ROOT / n
        for n in names
        if not n.startswith("docs/") and Path(n).suffix in SCANNED_SUFFIXES and n != own and (ROOT / n).is_file()
    ]


@cache
def _headings(path: Path) -> frozenset[str]:
    """Returns the section numbers the file's numbered headings define (`## 5.`, `### 5.1`, `## 1a.`)."""
    found = set()
    for line in path.read_text(encoding="utf-8").splitlines():
        m = _HEADING.match(line)
        if m:
            found.add(m.group(1))
    return frozenset(found)


def _citations() -> list[tuple[str, int, str, list[str]]]:
    """Returns every citation as (file, line number, cited path, cited sections)."""
    found = []
    for file in _scanned_files():
        text = file.read_text(encoding="utf-8", errors="replace")
        for lineno, line in enumerate(text.splitlines(), 1):
            for m in _CITATION.finditer(line):
                sections = _SECTION_TOKEN.findall(m.group("sections") or "")
                found.append((file.relative_to(ROOT).as_posix(), lineno, m.group("path"), sections))
    return found


def test_every_cited_docs_file_and_section_exists():
    citations = _citations()
    problems = []
    for where, lineno, path, sections in citations:
        target = ROOT / path
        if not target.is_file():
            problems.append(f"{where}:{lineno}: {path} does not exist")
            continue
        for section in sections:
            if section not in _headings(target):
                problems.append(f"{where}:{lineno}: {path} has no heading §{section}")
    n_sections = sum(len(s) for *_, s in citations)
    print(f"checked {len(citations)} docs citations ({n_sections} sections) in {len(_scanned_files())} files")
    assert citations, "no docs/ citation found: the scan is broken"
    assert not problems, "\n".join(problems)


def test_no_citation_points_outside_the_repository_or_at_an_old_name():
    problems = []
    for file in _scanned_files():
        text = file.read_text(encoding="utf-8", errors="replace")
        for lineno, line in enumerate(text.splitlines(), 1):
            for pattern, what in _STALE:
                if pattern.search(line):
                    problems.append(f"{file.relative_to(ROOT).as_posix()}:{lineno}: {what}: {line.strip()[:120]}")
    assert not problems, "\n".join(problems)


def test_headings_and_citations_parse_as_documented():
    assert _HEADING.match("## 5. Rewards").group(1) == "5"
    assert _HEADING.match("### 5.1 Execution reward").group(1) == "5.1"
    assert _HEADING.match("## 1a. TextCraft-Synth").group(1) == "1a"
    assert _HEADING.match("## Rewards") is None
    cases = {
        "see docs/design/algorithm.md §5.1).": ("docs/design/algorithm.md", ["5.1"]),
        "docs/design/textworld.md §5-§9)": ("docs/design/textworld.md", ["5", "9"]),
        "docs/design/textworld.md §10–12); every": ("docs/design/textworld.md", ["10", "12"]),
        "docs/design/recipes.md §2.4–2.5):": ("docs/design/recipes.md", ["2.4", "2.5"]),
        "docs/design/recipes.md §1b/§1c/§4": ("docs/design/recipes.md", ["1b", "1c", "4"]),
        "docs/design/textworld.md §5, §14). Every": ("docs/design/textworld.md", ["5", "14"]),
        "docs/design/textworld.md §4, checklist 4)": ("docs/design/textworld.md", ["4"]),
        "docs/design/house.md's tree": ("docs/design/house.md", []),
    }
    for text, (path, sections) in cases.items():
        m = _CITATION.search(text)
        assert m.group("path") == path, text
        assert _SECTION_TOKEN.findall(m.group("sections") or "") == sections, text
    stale = [what for pattern, what in _STALE if pattern.search("as in recipes.md §2")]
    assert stale == ["bare `recipes.md`"]
    assert not [what for pattern, what in _STALE if pattern.search("docs/design/recipes.md §2")]
