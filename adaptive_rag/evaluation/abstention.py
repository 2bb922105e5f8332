"""Abstention measured without the reader: which questions a knowledge base's threshold hands to
a human, and which it lets through.

A retrieving strategy decides to abstain on the question's own retrieval, before the reader runs
(`strategies.abstention`), so the decision is measured here with the retriever alone, by the same
`Abstention.reason` the strategies call, for several rows of thresholds at once. A knowledge base
is imported through `KnowledgeBaseService` (embedded tantivy, SQLite records in a temporary
directory), so its automatic threshold is derived exactly as a tenant's is.

Per knowledge base and row: the share of questions it does not cover that abstain ("caught") and
the share of questions it covers that abstain ("false abstentions"), per kind of question, with
bootstrap 95 % intervals, and paired differences between rows on the same questions. The records
keep each question's top score and relevance, and each knowledge base keeps the reference
questions' and its own passage titles' (pseudo-questions), so other thresholds can be judged
from them (`candidate_table`, on `train` only).
"""

from __future__ import annotations

import gzip
import json
import random
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from adaptive_rag.evaluation.bootstrap import Interval, bootstrap_mean, difference_interval
from adaptive_rag.evaluation.datasets import split_of
from adaptive_rag.knowledge.calibration import quantile, reference_questions
from adaptive_rag.domain import Passage
from adaptive_rag.knowledge.documents import Document
from adaptive_rag.ports import Retriever
from adaptive_rag.retrieval.relevance import relevance
from adaptive_rag.strategies.abstention import Abstention

NONE, HAND_TUNED, AUTOMATIC = "none", "hand-tuned", "automatic"
WITH_COVERAGE = "automatic+coverage"  # the automatic threshold, or too little of the question's weight found
PSEUDO_QUESTIONS = 200  # passage titles asked of a knowledge base as questions it covers


@dataclass(frozen=True)
class LabelledQuestion:
    """A question put to one knowledge base, and whether the knowledge base covers it."""

    id: str
    question: str
    kind: str
    covered: bool
    split: str


@dataclass
class GateRecord:
    """What the retrieval before the reader found for one question, and which rows abstained."""

    kb: str
    id: str
    kind: str
    covered: bool
    split: str
    top_score: float
    relevance: float | None
    passages: int
    abstained: dict[str, bool] = field(default_factory=dict)
    coverage: float | None = None  # `term_coverage` of the top k (None: the index cannot say)


@dataclass
class KnowledgeBaseProbe:
    """A knowledge base as imported: its size, derived calibration, and the top score and
    relevance of the reference questions and of its own passage titles asked as questions."""

    name: str
    chunks: int
    calibration: dict[str, Any] | None
    reference: list[tuple[float, float]]
    titles: list[tuple[float, float]]


def demo_questions(path: Path) -> list[LabelledQuestion]:
    """The demo help centre's coverage questions (`demo/coverage_questions.json`), split 60/40 by
    the same hash rule as every suite (`split_of("demo-coverage", id)`)."""
    items = json.loads(Path(path).read_text(encoding="utf-8"))
    return [LabelledQuestion(item["id"], item["question"], item["kind"], item["kind"] == "covered",
                             split_of("demo-coverage", item["id"])) for item in items]


def import_knowledge_base(documents: Sequence[Document], work: Path, tenant: str = "probe"):
    """`documents` imported as tenant `tenant` into embedded tantivy under `work`, SQLite records
    beside it: the `KnowledgeBaseService` (its threshold derived on import)."""
    from adaptive_rag.knowledge.indexes import TantivyKnowledgeIndex
    from adaptive_rag.knowledge.service import KnowledgeBaseService
    from adaptive_rag.storage import KnowledgeRecords, make_engine, upgrade_database

    url = f"sqlite:///{work / 'records.db'}"
    upgrade_database(url)
    service = KnowledgeBaseService(TantivyKnowledgeIndex(work / "kb"), KnowledgeRecords(make_engine(url)),
                                   backend="tantivy")
    service.upsert(tenant, documents)
    return service


def _scored(retriever: Retriever, question: str) -> tuple[float, float]:
    found = retriever.search(question, 1)
    return (found[0].score if found else 0.0), (relevance(retriever, question, found) or 0.0)


def probe(name: str, retriever: Retriever, chunks: int, calibration: dict[str, Any] | None,
          titles: Sequence[str], seed: int = 0) -> KnowledgeBaseProbe:
    """The reference questions and (up to `PSEUDO_QUESTIONS`) passage titles asked of the
    knowledge base."""
    distinct = sorted(set(t for t in titles if t.strip()))
    chosen = random.Random(seed).sample(distinct, min(PSEUDO_QUESTIONS, len(distinct)))
    return KnowledgeBaseProbe(name, chunks, calibration,
                              [_scored(retriever, q) for q in reference_questions()],
                              [_scored(retriever, q) for q in chosen])


def gate(kb: str, retriever: Retriever, questions: Iterable[LabelledQuestion],
         rows: Mapping[str, Abstention], k: int = 5) -> list[GateRecord]:
    """Each question retrieved once (its top `k`, as a strategy retrieves it) and judged by every
    row's `Abstention`."""
    records = []
    for question in questions:
        found = retriever.search(question.question, k)
        records.append(GateRecord(
            kb, question.id, question.kind, question.covered, question.split,
            top_score=round(found[0].score, 4) if found else 0.0,
            relevance=_round(relevance(retriever, question.question, found)), passages=len(found),
            abstained={row: rule.reason(retriever, question.question, found) is not None
                       for row, rule in rows.items()},
            coverage=_round(term_coverage(retriever, question.question, found)),
        ))
    return records


def term_coverage(retriever: Retriever, question: str, passages: Sequence[Passage]) -> float | None:
    """The share of the question's weight (the summed idf of its analysed terms, a term the
    knowledge base lacks counting with the largest idf, as in `relevance`) carried by terms that
    occur in `passages`. Unlike relevance it does not grow with how often a common term repeats
    in a passage: "Is there a Lumora light for aquariums?" finds passages full of "Lumora" and
    "light" (relevance 0.7) that never say "aquarium" (coverage 0.15). None when the retriever is
    not a tantivy index (it needs the analyser and document frequencies)."""
    from adaptive_rag.retrieval.relevance import bm25_idf

    index = retriever._live() if hasattr(retriever, "_live") else retriever
    if not all(hasattr(index, name) for name in ("query_terms", "_searcher", "_analyzer")):
        return None
    terms = index.query_terms(question)
    if not terms or not passages:
        return 0.0
    searcher = index._searcher()
    fields = ("title", "section", "text") if getattr(index, "_has_kb_fields", False) else ("title", "text")
    idf = {t: bm25_idf(max(searcher.doc_freq(f, t) for f in fields), searcher.num_docs) for t in terms}
    found: set[str] = set()
    for passage in passages:
        found.update(index._analyzer.analyze(" ".join((passage.title, passage.section, passage.text))))
    total = sum(idf.values())
    return sum(v for t, v in idf.items() if t in found) / total if total > 0 else 0.0


def _round(value: float | None) -> float | None:
    return None if value is None else round(value, 4)


# --- summaries -------------------------------------------------------------------------------------


def _interval(values: Sequence[float]) -> dict[str, Any] | None:
    found = bootstrap_mean({"all": list(values)})
    return found.as_dict() if found else None


def summarise(records: Sequence[GateRecord], rows: Sequence[str]) -> dict[str, Any]:
    """Per row: caught (uncovered questions that abstain), false abstentions (covered ones that
    abstain), the abstain rate per kind; and paired differences of every row against `none`
    and of `automatic` against `hand-tuned`."""
    summary: dict[str, Any] = {"rows": {}, "differences": {}}
    kinds = sorted({r.kind for r in records})
    for row in rows:
        summary["rows"][row] = {
            "caught": _interval([float(r.abstained[row]) for r in records if not r.covered]),
            "false_abstain": _interval([float(r.abstained[row]) for r in records if r.covered]),
            "kinds": {kind: _interval([float(r.abstained[row]) for r in records if r.kind == kind])
                      for kind in kinds},
        }
    pairs = [(row, NONE) for row in rows if row != NONE]
    if AUTOMATIC in rows and HAND_TUNED in rows:
        pairs.append((AUTOMATIC, HAND_TUNED))
    if AUTOMATIC in rows and WITH_COVERAGE in rows:
        pairs.append((WITH_COVERAGE, AUTOMATIC))
    for first, second in pairs:
        for name, covered in (("caught", False), ("false_abstain", True)):
            a = {(r.kb, r.id): float(r.abstained[first]) for r in records if r.covered is covered}
            b = {(r.kb, r.id): float(r.abstained[second]) for r in records if r.covered is covered}
            found: Interval | None = difference_interval(a, b)
            summary["differences"][f"{first} - {second}, {name}"] = found.as_dict() if found else None
    return summary


def auc(positives: Sequence[float], negatives: Sequence[float]) -> float | None:
    """The chance that a random positive scores above a random negative (ties count half)."""
    if not positives or not negatives:
        return None
    above = sum((p > n) + 0.5 * (p == n) for p in positives for n in negatives)
    return above / (len(positives) * len(negatives))


def candidate_table(records: Sequence[GateRecord], probes: Mapping[str, KnowledgeBaseProbe],
                    floors: Sequence[float], quantiles: Sequence[float]) -> list[dict[str, Any]]:
    """Other ways to set each knowledge base's threshold, judged on `records` (give `train` ones
    only): the raw top score or the relevance, below the `q` quantile of the reference questions
    (relevance: never below `floor`), or at the best split between the reference questions and
    the knowledge base's own titles. One row per candidate with caught / false per knowledge base."""
    def judged(signal: int, thresholds: Mapping[str, float]) -> dict[str, tuple[float, float]]:
        cells = {}
        for kb in probes:
            mine = [r for r in records if r.kb == kb]
            value = (lambda r: r.top_score) if signal == 0 else (lambda r: r.relevance or 0.0)
            out = [value(r) < thresholds[kb] for r in mine if not r.covered]
            inside = [value(r) < thresholds[kb] for r in mine if r.covered]
            cells[kb] = (sum(out) / max(len(out), 1), sum(inside) / max(len(inside), 1))
        return cells

    table = []
    for signal, label in ((0, "BM25 top score"), (1, "relevance")):
        for q in quantiles:
            for floor in (floors if signal == 1 else [0.0]):
                thresholds = {kb: max(floor, quantile([s[signal] for s in p.reference], q))
                              for kb, p in probes.items()}
                name = f"{label}: reference q{q:g}" + (f", floor {floor:g}" if floor else "")
                table.append({"candidate": name, "thresholds": thresholds, "cells": judged(signal, thresholds)})
        thresholds = {kb: _best_split([s[signal] for s in p.titles], [s[signal] for s in p.reference])
                      for kb, p in probes.items()}
        table.append({"candidate": f"{label}: best split, own titles vs reference", "thresholds": thresholds,
                      "cells": judged(signal, thresholds)})
    return table


def add_coverage_row(records: Sequence[GateRecord], min_coverage: float) -> None:
    """Record the `automatic+coverage` row: the automatic threshold abstains, or the top passages
    carry less than `min_coverage` of the question's weight."""
    for record in records:
        low = record.coverage is not None and record.coverage < min_coverage
        record.abstained[WITH_COVERAGE] = record.abstained[AUTOMATIC] or low


def coverage_candidates(records: Sequence[GateRecord], thresholds: Sequence[float]) -> list[dict[str, Any]]:
    """One fixed coverage floor per row, added to each knowledge base's automatic threshold: caught
    / false per knowledge base (give `train` records only). Coverage is a share of the question's
    own weight, so one floor means the same on every knowledge base."""
    table = []
    kbs = sorted({r.kb for r in records})
    for t in thresholds:
        cells = {}
        for kb in kbs:
            mine = [r for r in records if r.kb == kb]
            rule = [(r.covered, r.abstained[AUTOMATIC] or (r.coverage is not None and r.coverage < t)) for r in mine]
            out = [a for c, a in rule if not c]
            inside = [a for c, a in rule if c]
            cells[kb] = (sum(out) / max(len(out), 1), sum(inside) / max(len(inside), 1))
        table.append({"candidate": f"automatic, or coverage below {t:g}", "min_coverage": t,
                      "thresholds": {kb: t for kb in kbs}, "cells": cells})
    return table


def _best_split(inside: Sequence[float], outside: Sequence[float]) -> float:
    """The threshold that best separates `inside` (kept) from `outside` (abstain): Youden's J."""
    def j(t: float) -> float:
        return (sum(o < t for o in outside) / len(outside)) - (sum(i < t for i in inside) / len(inside))
    return max(sorted(set(inside) | set(outside)), key=j)


def write_records(records: Iterable[GateRecord], path: Path) -> None:
    """One JSON line per record; gzipped when the name ends in .gz."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with (gzip.open if path.suffix == ".gz" else open)(path, "wt", encoding="utf-8") as sink:
        sink.writelines(json.dumps(asdict(r)) + "\n" for r in records)


def read_records(path: Path) -> list[GateRecord]:
    with (gzip.open if Path(path).suffix == ".gz" else open)(path, "rt", encoding="utf-8") as source:
        return [GateRecord(**json.loads(line)) for line in source if line.strip()]
