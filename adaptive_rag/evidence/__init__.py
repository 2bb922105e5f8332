"""Evidence for the reader: which few passages a question's answer is read from.

One contract (`EvidenceGatherer`: a question, a retriever and a budget k in; the ordered
passages and the steps taken out) and the gatherers behind it, by name: `bm25` (B's retrieval),
`bridge`, `links`, `ppr`, `parts`, `focused` and `chain` (see `gatherers`). `links` and `ppr` walk the
knowledge base's `EntityGraph` (see `graph`); without one they fall back to B's evidence.
"""

from __future__ import annotations

from adaptive_rag.errors import ConfigurationError
from adaptive_rag.evidence.base import Evidence, EvidenceGatherer, reciprocal_rank_fusion
from adaptive_rag.evidence.gatherers import Bm25Evidence, Components, FusedEvidence, Hops, Weights, collect, fuse
from adaptive_rag.evidence.graph import EntityGraph

# Each fused gatherer's weights; `chain`'s are the combination selected on `train` by
# `python -m lab.experiments.evidence` (reports/evidence/).
WEIGHTS: dict[str, Weights] = {
    "bridge": Weights(first=1.0, bridge=1.0),
    "links": Weights(first=1.0, links=1.0),
    "ppr": Weights(first=1.0, ppr=1.0),
    "parts": Weights(first=1.0, parts=1.0),
    "focused": Weights(first=1.0, focused=2),
    "chain": Weights(first=1.0, links=0.5, ppr=0.5, parts=2.0, focused=1),
}
GATHERERS = ("bm25", *WEIGHTS)
NEEDS_GRAPH = frozenset(name for name, w in WEIGHTS.items() if w.links > 0 or w.ppr > 0)


def make_gatherer(
    name: str, graph: EntityGraph | None = None, hops: Hops | None = None
) -> EvidenceGatherer:
    """The gatherer called `name`; `graph` is the knowledge base's entity graph (the gatherers
    that walk it fall back to B's evidence without one)."""
    if name == "bm25":
        return Bm25Evidence()
    if name not in WEIGHTS:
        raise ConfigurationError(f"unknown evidence gatherer {name!r}; known: {', '.join(GATHERERS)}")
    return FusedEvidence(name, WEIGHTS[name], hops or Hops(), graph)


__all__ = [
    "GATHERERS", "NEEDS_GRAPH", "WEIGHTS", "Bm25Evidence", "Components", "EntityGraph", "Evidence",
    "EvidenceGatherer", "FusedEvidence", "Hops", "Weights", "collect", "fuse", "make_gatherer",
    "reciprocal_rank_fusion",
]
