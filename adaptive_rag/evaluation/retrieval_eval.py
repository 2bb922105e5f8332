"""Retrieval quality and speed: recall@k of gold supporting paragraphs, query latency."""

from __future__ import annotations

import statistics
import time
from collections import defaultdict
from collections.abc import Callable, Iterable, Sequence

from adaptive_rag.evaluation.datasets import Question
from adaptive_rag.ports import Retriever


def recall_at_k(
    retriever: Retriever,
    questions: Iterable[Question],
    ks: Sequence[int] = (2, 5, 10),
    on_progress: Callable[[int], None] | None = None,
) -> dict[str, dict[int, float]]:
    """Per dataset, mean share of a question's gold titles found in the top k (question as query).

    Questions without supporting titles are skipped. Passages are matched by title, as the
    benchmark files name supporting facts by title.
    """
    sums: dict[str, dict[int, float]] = defaultdict(lambda: defaultdict(float))
    counts: dict[str, int] = defaultdict(int)
    depth = max(ks)
    for question in questions:
        if on_progress:
            on_progress(1)
        gold = set(question.supporting_titles)
        if not gold:
            continue
        titles = [p.title for p in retriever.search(question.question, depth)]
        counts[question.dataset] += 1
        for k in ks:
            sums[question.dataset][k] += len(gold & set(titles[:k])) / len(gold)
    return {ds: {k: sums[ds][k] / counts[ds] for k in ks} for ds in counts}


def percentile(values: Sequence[float], q: float) -> float:
    """The q-th percentile (0-100) by linear interpolation; 0.0 for no values."""
    if not values:
        return 0.0
    if len(values) == 1:
        return float(values[0])
    return float(statistics.quantiles(values, n=100, method="inclusive")[min(max(int(q), 1), 99) - 1])


def query_latencies(retriever: Retriever, queries: Iterable[str], k: int = 5) -> list[float]:
    """Seconds per `search` call, one query after another."""
    latencies = []
    for query in queries:
        start = time.perf_counter()
        retriever.search(query, k)
        latencies.append(time.perf_counter() - start)
    return latencies
