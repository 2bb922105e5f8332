"""The evidence gatherers: B's retrieval, and the ranked lists a multi-step question's evidence is
fused from.

Every gatherer starts from the question's own BM25 hits (the first hop) and adds ranked lists,
fused by reciprocal rank with a weight per kind of list:

- `bridge`: a second BM25 query per top first-hop passage (the question plus that passage), which
  finds what the passage leads to (the bridge entity's own page);
- `links`: the passages whose title the top first-hop passages mention;
- `ppr`: the passages a Personalized PageRank walk over the entity graph reaches from the
  question's entities and the first hop;
- `parts`: for a question that asks two, each part's own hits;
- `focused`: not fused but placed: a second BM25 query per top first-hop passage made of the
  question's words that passage's title lacks and the names the passage mentions (the bridge
  entity is named in the passage, the relation still to follow is in the rest of the question);
  the best hit of the first such queries takes the last of B's five places, where a fusion ranks
  what many lists agree on and the chain's one missing page seldom is;
- `chain`: the fusion of these that gathered the most complete evidence on `train`
  (`reports/evidence/`).

Only the lists a gatherer weighs are computed. The retriever is the port, so the gatherers run
on any engine; `links` and `ppr` also need the knowledge base's `EntityGraph`.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass, field, fields

from adaptive_rag.domain import Passage
from adaptive_rag.evidence.base import Evidence, reciprocal_rank_fusion
from adaptive_rag.evidence.graph import DAMPING, STOP_WORDS, EntityGraph, words
from adaptive_rag.ports import Retriever
from adaptive_rag.routing.rules import question_parts

B_EVIDENCE = "B's evidence"
FOCUSED_END = 5   # the focused hits take the places just before this rank (B's budget)
MAX_NAMES = 8     # names of a passage a focused query carries, in order of appearance
# A name: a run of capitalised words (an initial keeps its full stop, no other word does, so a
# name ends with its sentence), with the small words names join them by.
_NAME_WORD = r"(?:[A-ZÀ-ÖØ-Þ]\.|[A-ZÀ-ÖØ-Þ][\w'’-]*)"
_NAME = re.compile(rf"\b{_NAME_WORD}(?:\s+(?:(?:of|the|de|von|van|and|for|la|le|du|del|da)\s+)?{_NAME_WORD})*")
_QUERY_WORD = re.compile(r"\w+")


@dataclass(frozen=True)
class Weights:
    """How much each kind of ranked list counts in the fusion (0: not computed)."""

    first: float = 1.0
    bridge: float = 0.0
    links: float = 0.0
    ppr: float = 0.0
    parts: float = 0.0
    focused: int = 0   # not a weight: places for the focused hits, just before FOCUSED_END

    def extra(self) -> dict[str, float]:
        """The fused lists beyond the first hop, by name, with their weights."""
        return {f.name: getattr(self, f.name) for f in fields(self) if f.name not in ("first", "focused")}


@dataclass(frozen=True)
class Hops:
    """How deep each list goes and where its seeds come from."""

    first_depth: int = 10     # the first hop's hits
    bridge_seeds: int = 3     # first-hop passages that each get a second query
    bridge_depth: int = 10
    link_seeds: int = 3       # first-hop passages whose mentioned titles are followed
    ppr_seeds: int = 5        # first-hop passages the walk restarts at (besides the question's entities)
    ppr_depth: int = 10       # passages of the walk's ranking fused
    question_share: float = 0.5  # of the walk's restart mass on the question's entities
    damping: float = DAMPING
    parts_depth: int = 10
    focused_seeds: int = 3    # first-hop passages that each get a focused query


@dataclass
class Components:
    """Every ranked list one question's evidence is fused from, and how they were found."""

    first: list[Passage]
    bridge: list[list[Passage]] = field(default_factory=list)
    links: list[Passage] = field(default_factory=list)
    ppr: list[Passage] = field(default_factory=list)
    parts: list[list[Passage]] = field(default_factory=list)
    focused: list[Passage] = field(default_factory=list)  # each focused query's best hit, seed order
    steps: list[str] = field(default_factory=list)
    searches: int = 1

    def rankings(self, weights: Weights) -> list[tuple[Sequence[Passage], float]]:
        lists: list[tuple[Sequence[Passage], float]] = [(self.first, weights.first)]
        lists += [(hop, weights.bridge) for hop in self.bridge]
        lists += [(self.links, weights.links), (self.ppr, weights.ppr)]
        lists += [(part, weights.parts) for part in self.parts]
        return lists

    def contributed(self, weights: Weights) -> bool:
        """Whether a weighed list beyond the first hop found a passage the first hop lacks (else
        the fusion could only reorder the first hop: B's evidence is handed instead)."""
        first_hop = {p.id for p in self.first}
        lists = {"bridge": self.bridge, "links": [self.links], "ppr": [self.ppr], "parts": self.parts}
        return any(
            weight > 0 and any(p.id not in first_hop for ranking in lists[name] for p in ranking)
            for name, weight in weights.extra().items()
        ) or (weights.focused > 0 and any(p.id not in first_hop for p in self.focused))


def collect(
    question: str,
    retriever: Retriever,
    weights: Weights,
    hops: Hops = Hops(),
    graph: EntityGraph | None = None,
    k: int = 0,
) -> Components:
    """The ranked lists `weights` asks for (the first hop always: B's evidence is its top k)."""
    first = retriever.search(question, max(hops.first_depth, k))
    found = Components(first=first, steps=[f"first hop: BM25, {len(first)} passages"])
    if weights.bridge > 0:
        _bridge(found, question, retriever, hops)
    if weights.links > 0:
        _links(found, graph, hops)
    if weights.ppr > 0:
        _ppr(found, question, graph, hops)
    if weights.parts > 0:
        _parts(found, question, retriever, hops)
    if weights.focused > 0:
        _focused(found, question, retriever, hops)
    return found


def _bridge(found: Components, question: str, retriever: Retriever, hops: Hops) -> None:
    seeds = found.first[: hops.bridge_seeds]
    for seed in seeds:
        hop = retriever.search(f"{question} {seed.title} {seed.text}", hops.bridge_depth + 1)
        found.bridge.append([p for p in hop if p.id != seed.id][: hops.bridge_depth])
    found.searches += len(seeds)
    new = {p.id for hop in found.bridge for p in hop} - {p.id for p in found.first}
    found.steps.append(
        f"bridge: question + passage, {len(seeds)} second queries, {len(new)} passages beyond the first hop"
        if seeds else "bridge: no first-hop passage to start from"
    )


def _links(found: Components, graph: EntityGraph | None, hops: Hops) -> None:
    if graph is None or not len(graph):
        found.steps.append("links: no entity graph")
        return
    seen: set[str] = set()
    for seed in found.first[: hops.link_seeds]:
        for passage in graph.linked(seed):
            if passage.id not in seen:
                seen.add(passage.id)
                found.links.append(passage)
    found.steps.append(f"links: {len(found.links)} passages titled by what the first hop mentions"
                       if found.links else "links: the first hop mentions no title of the knowledge base")


def _ppr(found: Components, question: str, graph: EntityGraph | None, hops: Hops) -> None:
    if graph is None or not len(graph):
        found.steps.append("ppr: no entity graph")
        return
    entities = graph.question_entities(question)
    passages = [graph.passage_node[p.id] for p in found.first[: hops.ppr_seeds] if p.id in graph.passage_node]
    if not entities and not passages:
        found.steps.append("ppr: no seed (no entity in the question, no first-hop passage in the graph)")
        return
    share = hops.question_share if entities and passages else (1.0 if entities else 0.0)
    seeds: dict[int, float] = {}
    for entity in entities:
        seeds[graph.entity_node(entity)] = share / len(entities)
    rank_weights = [1.0 / rank for rank in range(1, len(passages) + 1)]
    for node, weight in zip(passages, rank_weights):
        seeds[node] = seeds.get(node, 0.0) + (1 - share) * weight / sum(rank_weights)
    scores = graph.personalized_pagerank(seeds, damping=hops.damping)[: len(graph)]
    # The first hop's passages are the walk's seeds and outrank what it reaches through them;
    # the walk's list is what it adds, the fusion puts it beside the first hop.
    scores[[graph.passage_node[p.id] for p in found.first if p.id in graph.passage_node]] = 0.0
    top = scores.argsort()[::-1][: hops.ppr_depth]
    found.ppr = [graph.passages[n] for n in top if scores[n] > 0]
    found.steps.append(f"ppr: walk from {len(entities)} question entities and {len(passages)} "
                       f"first-hop passages, {len(found.ppr)} passages beyond the first hop")


def _parts(found: Components, question: str, retriever: Retriever, hops: Hops) -> None:
    parts = question_parts(question)
    if len(parts) < 2:
        found.steps.append("parts: one question")
        return
    for part in parts:
        found.parts.append(retriever.search(part, hops.parts_depth))
    found.searches += len(parts)
    found.steps.append(f"parts: {len(parts)} questions, each retrieved on its own")


def names(text: str, exclude: str = "") -> list[str]:
    """The names `text` mentions (runs of capitalised words, less the small words that open a
    sentence), first appearance first, without those `exclude` contains."""
    excluded, found = exclude.lower(), []
    for match in _NAME.finditer(text):
        name_words = match.group(0).split()
        while name_words and name_words[0].lower() in STOP_WORDS:  # "The", "In" opening a sentence
            name_words.pop(0)
        name = " ".join(name_words)
        if len(name) < 3 or name.lower() in excluded or name in found:
            continue
        found.append(name)
    return found


def focused_query(question: str, seed: Passage) -> str:
    """The next hop's query from `seed`: the question's words its title lacks (what is still to
    follow), and the names it mentions that the question does not (where to follow it)."""
    title = set(words(seed.title))
    rest = [w for w in _QUERY_WORD.findall(question) if w.lower() not in title and w.lower() not in STOP_WORDS]
    return " ".join(rest + names(seed.text, exclude=question)[:MAX_NAMES]).strip()


def _focused(found: Components, question: str, retriever: Retriever, hops: Hops) -> None:
    asked = 0
    for seed in found.first[: hops.focused_seeds]:
        query = focused_query(question, seed)
        if not query:
            continue
        asked += 1
        best = next((p for p in retriever.search(query, 2) if p.id != seed.id), None)
        if best is not None and best.id not in {p.id for p in found.focused}:
            found.focused.append(best)
    found.searches += asked
    found.steps.append(f"focused: {asked} queries (the question's rest + the names a first-hop passage "
                       f"mentions), {len(found.focused)} best hits")


def place_focused(ranking: Sequence[Passage], focused: Sequence[Passage], places: int) -> list[Passage]:
    """`ranking` with up to `places` of the focused hits it does not already rank before them put
    just before FOCUSED_END; the same order at any budget."""
    head = list(ranking[: max(FOCUSED_END - places, 0)])
    taken = {p.id for p in head}
    for passage in focused:
        if len(head) >= FOCUSED_END or places == 0:
            break
        if passage.id not in taken:
            head.append(passage)
            taken.add(passage.id)
            places -= 1
    return head + [p for p in ranking if p.id not in taken]


def fuse(found: Components, weights: Weights, k: int) -> Evidence:
    """The first k passages of the weighted fusion, or B's evidence (the first hop's top k) when
    no list beyond the first hop found anything."""
    steps = list(found.steps)
    if not found.contributed(weights):
        reason = "nothing found beyond the first hop"
        steps.append(f"fallback: {reason}; {B_EVIDENCE}")
        return Evidence(found.first[:k], steps, found.searches, fallback=reason, question_hits=found.first)
    passages = reciprocal_rank_fusion(found.rankings(weights))
    if weights.focused > 0:
        passages = place_focused(passages, found.focused, weights.focused)
    passages = passages[:k]
    steps.append(f"fused by reciprocal rank: {len(passages)} passages")
    return Evidence(passages, steps, found.searches, question_hits=found.first)


@dataclass
class Bm25Evidence:
    """B's retrieval: the question's top k by BM25, as tier B reads it."""

    name: str = "bm25"

    def gather(self, question: str, retriever: Retriever, k: int) -> Evidence:
        passages = retriever.search(question, k)
        return Evidence(passages, [f"BM25: {len(passages)} passages for the question"], searches=1,
                        question_hits=passages)


@dataclass
class FusedEvidence:
    """The first hop fused with the lists `weights` asks for."""

    name: str
    weights: Weights
    hops: Hops = Hops()
    graph: EntityGraph | None = None

    def gather(self, question: str, retriever: Retriever, k: int) -> Evidence:
        return fuse(collect(question, retriever, self.weights, self.hops, self.graph, k), self.weights, k)
