"""The support suite's third knowledge base: a help centre of Markdown pages, kept out of the
abstention rule's design.

Quillbill is a fictional online invoicing service; its help centre (`support_data/quillbill/`, 45
Markdown pages with headings, numbered steps, tables and links between pages, a few long enough
that the chunker splits a section) and its questions were written for this project after the
abstention rule and the follow-up rewriting rules were fixed, and never used to tune either. The
pages go through the product's own importer and chunker, as `arag kb import` takes a directory.

Questions (`support_data/quillbill_questions.jsonl`), each with a stable id:

- `covered` -> `question` (B): one page answers it (`pages`: one group; any page of it counts);
- `two_pages` -> `joined` (C): two parts, each answered by its own page (both must be found);
- `uncovered` (B, must abstain): about Quillbill, but no page answers it;
- `off_topic` -> `out_of_kb` (B, must abstain);
- follow-ups (`support_data/quillbill_follow_ups.jsonl`): a question, a follow-up that only makes
  sense after it, the follow-up written to stand alone, and the page(s) that answer it.

Split: `split_of("support", id)`, the suite's own rule, for questions and turns alike.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from adaptive_rag.errors import ConfigurationError
from adaptive_rag.evaluation.support import (
    GOLD_TIER,
    JOINED,
    OUT_OF_KB,
    QUESTION,
    UNCOVERED,
    FaqEntry,
    FollowUpTurn,
    SupportQuery,
    SupportSuite,
    kb_passages,
)
from adaptive_rag.knowledge.documents import derived_document_id
from adaptive_rag.settings import Settings

QUILLBILL = "quillbill"
DATA = Path(__file__).with_name("support_data")
PAGES_DIR = DATA / "quillbill"
QUESTIONS_FILE = DATA / "quillbill_questions.jsonl"
FOLLOW_UPS_FILE = DATA / "quillbill_follow_ups.jsonl"
KIND_OF = {"covered": QUESTION, "two_pages": JOINED, "uncovered": UNCOVERED, "off_topic": OUT_OF_KB}


def page_id(page: str) -> str:
    """The document id the importer gives a page of the directory (its path relative to it)."""
    return derived_document_id(page, prefix="md")


def _lines(path: Path) -> list[dict[str, Any]]:
    if not path.is_file():
        raise ConfigurationError(f"Quillbill help centre file missing: {path}")
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]


def _groups(item: dict[str, Any], known: set[str]) -> tuple[tuple[str, ...], ...]:
    groups = tuple(tuple(page_id(page) for page in group) for group in item.get("pages") or ())
    if any(not group or not set(group) <= known for group in groups):
        raise ConfigurationError(f"{item['id']}: a gold page is not in the help centre: {item.get('pages')}")
    return groups


def build_quillbill(settings: Settings | None = None, pages: Path = PAGES_DIR,
                    questions: Path = QUESTIONS_FILE, follow_ups: Path = FOLLOW_UPS_FILE) -> SupportSuite:
    """The Markdown help centre imported and chunked as a tenant's, with its questions and turns."""
    from adaptive_rag.knowledge.importers import import_path

    settings = settings or Settings()
    if not Path(pages).is_dir():
        raise ConfigurationError(f"Quillbill help centre pages missing: {pages}")
    documents = import_path(Path(pages))
    known = {doc.id for doc in documents}
    entries = [FaqEntry(doc.id, doc.title, doc.text, row) for row, doc in enumerate(documents)]
    queries = []
    for item in _lines(questions):
        kind = KIND_OF[item["kind"]]
        groups = _groups(item, known)
        if (kind in (QUESTION, JOINED)) != bool(groups) or (kind == JOINED and len(groups) != 2):
            raise ConfigurationError(f"{item['id']}: a {item['kind']} question has the wrong number of gold groups")
        if groups and not item.get("answer"):
            raise ConfigurationError(f"{item['id']}: an answered question needs its gold answer")
        queries.append(SupportQuery(
            id=item["id"], kind=kind, query=item["question"], gold_tier=GOLD_TIER[kind], gold_groups=groups,
            gold_answers=(item["answer"],) if item.get("answer") else (), expect_abstain=not groups,
        ))
    turns = []
    for item in _lines(follow_ups):
        (gold,) = _groups({**item, "pages": [item["pages"]]}, known)  # a turn's pages: one group
        turns.append(FollowUpTurn(item["id"], item["previous"], item["follow_up"], item["standalone"], gold))
    return SupportSuite(entries, kb_passages(documents, settings), queries, turns, QUILLBILL,
                        f"the Quillbill help centre ({len(documents)} Markdown pages)", held_out=True)
