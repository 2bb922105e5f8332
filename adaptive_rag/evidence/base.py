"""The evidence contract: what a gatherer hands the reader, and how ranked lists are fused."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Protocol, runtime_checkable

from adaptive_rag.domain import Passage
from adaptive_rag.ports import Retriever

RRF_CONSTANT = 60  # reciprocal rank fusion's k (Cormack et al. 2009): flattens the top ranks' lead


@dataclass(slots=True)
class Evidence:
    """The passages for the reader, best first, and what was done to find them.

    `searches` counts retriever calls; `fallback` says why the gatherer handed B's evidence (the
    question's own top k) instead of its own, empty when it did not.
    """

    passages: list[Passage]
    steps: list[str] = field(default_factory=list)
    searches: int = 0
    fallback: str = ""


@runtime_checkable
class EvidenceGatherer(Protocol):
    """Gathers at most `k` passages for `question` through `retriever`.

    Never raises on degenerate input (no entity, an empty graph, a one-passage knowledge base,
    an empty question): it falls back to B's evidence and says so in the steps. The passages at
    budget k are the first k of the same ranking at any larger budget.
    """

    name: str

    def gather(self, question: str, retriever: Retriever, k: int) -> Evidence:
        ...


def reciprocal_rank_fusion(
    rankings: Sequence[tuple[Sequence[Passage], float]], constant: int = RRF_CONSTANT
) -> list[Passage]:
    """One ranking from several weighted ones: a passage scores the sum of weight / (constant +
    rank) over the lists it is in (rank from 1); ties keep the order of first appearance."""
    scores: dict[str, float] = {}
    first_seen: dict[str, Passage] = {}
    for ranking, weight in rankings:
        if weight <= 0:
            continue
        for rank, passage in enumerate(ranking, start=1):
            first_seen.setdefault(passage.id, passage)
            scores[passage.id] = scores.get(passage.id, 0.0) + weight / (constant + rank)
    order = {pid: n for n, pid in enumerate(first_seen)}
    ranked = sorted(scores, key=lambda pid: (-scores[pid], order[pid]))
    return [first_seen[pid] for pid in ranked]
