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
from adaptive_rag.knowledge.documents import Document
from adaptive_rag.ports import Retriever
from adaptive_rag.retrieval.relevance import relevance
from adaptive_rag.strategies.abstention import Abstention

NONE, HAND_TUNED, AUTOMATIC = "none", "hand-tuned", "automatic"
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
        ))
    return records


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
