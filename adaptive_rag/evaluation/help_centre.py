"""The support suite's second knowledge base: a product help centre, not an FAQ.

The demo's help centre (`demo/knowledge_base.jsonl`: 47 articles about the fictional Lumora smart
lighting, written for the project) with the questions written for it in
`demo/coverage_questions.json`, the same questions the abstention experiment asks
(`lab/experiments/abstention.py`), so no fact is written twice:

- `question` (B): an article answers it; gold = that article, gold answer = the `answer` field;
- `uncovered` (B, must abstain): about Lumora's products or services, but no article answers it;
- `out_of_kb` (B, must abstain): off-topic;
- follow-ups (`support_data/help_centre_follow_ups.jsonl`): a covered question, then another
  covered question asked as a user types it after the first ("can I cut it to length?"); the
  second question as written in the coverage set is the standalone reference and gives the gold
  article, so the turns hold no fact of their own.

Split: `split_of("demo-coverage", id)` for the questions (the abstention experiment's rule, so a
question is `test` in both), `split_of("support", id)` for the follow-ups.
"""

from __future__ import annotations

import json
from pathlib import Path

from adaptive_rag.errors import ConfigurationError
from adaptive_rag.evaluation.support import (
    GOLD_TIER,
    OUT_OF_KB,
    QUESTION,
    UNCOVERED,
    FaqEntry,
    FollowUpTurn,
    SupportQuery,
    SupportSuite,
    kb_passages,
)
from adaptive_rag.settings import Settings

HELP_CENTRE = "help-centre"
DEMO_DIR = Path(__file__).resolve().parents[2] / "demo"
SPLIT_KEY = "demo-coverage"
FOLLOW_UPS_FILE = Path(__file__).with_name("support_data") / "help_centre_follow_ups.jsonl"
KIND_OF = {"covered": QUESTION, "in_domain_uncovered": UNCOVERED, "off_topic": OUT_OF_KB}


def build_help_centre(settings: Settings | None = None, demo_dir: Path = DEMO_DIR,
                      follow_ups: Path = FOLLOW_UPS_FILE) -> SupportSuite:
    """The help centre imported as a tenant's, with its questions and follow-up turns."""
    from adaptive_rag.knowledge.importers import import_path

    settings = settings or Settings()
    articles, questions_file = Path(demo_dir) / "knowledge_base.jsonl", Path(demo_dir) / "coverage_questions.json"
    for path in (articles, questions_file):
        if not path.is_file():
            raise ConfigurationError(f"help centre file missing: {path} (the demo directory of a source checkout)")
    documents = import_path(articles)
    known = {doc.id for doc in documents}
    entries = [FaqEntry(doc.id, doc.title, doc.text, row) for row, doc in enumerate(documents)]
    items = json.loads(questions_file.read_text(encoding="utf-8"))
    by_id = {item["id"]: item for item in items}
    queries = []
    for item in items:
        kind = KIND_OF[item["kind"]]
        needs = tuple(item.get("needs") or ())
        if kind == QUESTION and (not needs or not set(needs) <= known or not item.get("answer")):
            raise ConfigurationError(f"{item['id']}: a covered question needs known articles and an answer")
        queries.append(SupportQuery(
            id=item["id"], kind=kind, query=item["question"], gold_tier=GOLD_TIER[kind],
            gold_groups=(needs,) if needs else (), gold_answers=(item["answer"],) if item.get("answer") else (),
            expect_abstain=kind != QUESTION, split_key=SPLIT_KEY,
        ))
    turns = []
    for line in Path(follow_ups).read_text(encoding="utf-8").splitlines():
        if not line.strip():
            continue
        turn = json.loads(line)
        previous, standalone = by_id[turn["previous"]], by_id[turn["standalone"]]
        turns.append(FollowUpTurn(turn["id"], previous["question"], turn["follow_up"], standalone["question"],
                                  tuple(standalone["needs"])))
    return SupportSuite(entries, kb_passages(documents, settings), queries, turns, HELP_CENTRE,
                        f"the demo help centre ({len(documents)} articles)")
