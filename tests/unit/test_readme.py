"""The README stays a front door: short, and a way into every page of docs/."""

from __future__ import annotations

import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
README = REPO / "README.md"
MAX_LINES = 150


def test_readme_is_short():
    lines = README.read_text(encoding="utf-8").count("\n")
    assert lines <= MAX_LINES, f"README.md has {lines} lines; reference belongs in docs/"


def test_readme_links_every_docs_page():
    linked = set(re.findall(r"\]\((docs/[^)#]+\.md)", README.read_text(encoding="utf-8")))
    pages = {page.relative_to(REPO).as_posix() for page in (REPO / "docs").glob("*.md")}
    assert pages - linked == set(), "link these from README.md"


def test_where_things_live_comes_before_the_commands():
    text = README.read_text(encoding="utf-8")
    assert text.index("## Where things live") < text.index("## Two commands")
