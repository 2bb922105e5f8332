"""An entity graph over a knowledge base's passages, walked by Personalized PageRank: HippoRAG's
retrieval graph without an LLM.

Entities are the knowledge base's own titles ("Charles Mathew", "American Splendor (film)" ->
"american splendor"): a passage is linked to the entity its title names and to every entity
whose title it mentions, found by exact word-sequence matching (no model, no extraction step).
A walk from the question's entities and its first-hop passages reaches the passages that name
what those passages mention: the second hop of a bridge question.

Matching is a dictionary of titles as word tuples, looked up at each word of the text (longest
title first): exact at word boundaries and linear in the text. Entities that say little are
left out of mentions: titles of stop words or numbers only, one-word titles of fewer than four
letters, and titles mentioned by more than `max_mention_share` of the passages (hubs such as
"United States" would spread the walk over the whole graph); they still link their own passage.

The walk runs on the bipartite passage-entity graph with numpy (a power iteration over the
graph's sparse transition matrix in CSR arrays), so it adds no dependency to the workers.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from adaptive_rag.domain import Passage

_WORD = re.compile(r"\w+")
_DISAMBIGUATION = re.compile(r"\s*\([^)]*\)\s*$")
STOP_WORDS = frozenset(
    "a an and are as at be but by for from had has have he her his i in is it its of on or she "
    "that the their they this to was were which who will with you we our not no what when where "
    "how why all any can do did does one two new after before about into than then there these "
    "those so if more most such only also other".split()
)
MIN_SINGLE_WORD_LETTERS = 4
MAX_MENTION_SHARE = 0.005  # an entity mentioned by more passages than this share is a hub
MIN_HUB_PASSAGES = 50      # ... but never below this many passages (small knowledge bases)
DAMPING = 0.5              # probability of following an edge; 1 - DAMPING restarts at the seeds
ITERATIONS = 20            # 0.5 ** 20: the walk has converged far below any rank difference
MAX_SUBSTRING_PROBES = 64  # an update probes texts by substring for up to this many changed titles; more: by word


def words(text: str) -> list[str]:
    """Lowercased word tokens, as titles and texts are matched."""
    return _WORD.findall(text.lower())


def entity_key(title: str) -> tuple[str, ...]:
    """The words a title is recognised by: its disambiguation suffix dropped, lowercased."""
    return tuple(words(_DISAMBIGUATION.sub("", title)))


def _informative(key: tuple[str, ...]) -> bool:
    if not key or all(w in STOP_WORDS or w.isdigit() for w in key):
        return False
    return len(key) > 1 or len(key[0]) >= MIN_SINGLE_WORD_LETTERS


class TitleMatcher:
    """Finds known titles in text at word boundaries, longest title first at each word."""

    def __init__(self, keys: Iterable[tuple[str, ...]]) -> None:
        self._ids: dict[tuple[str, ...], int] = {}
        lengths: dict[str, set[int]] = {}
        for key in keys:
            if key and key not in self._ids:
                self._ids[key] = len(self._ids)
                lengths.setdefault(key[0], set()).add(len(key))
        self._lengths = {first: sorted(found, reverse=True) for first, found in lengths.items()}

    @property
    def keys(self) -> dict[tuple[str, ...], int]:
        return self._ids

    def find(self, text: str) -> list[int]:
        """Ids of the titles mentioned in `text`, in order of first mention, each once."""
        tokens = words(text)
        found: dict[int, None] = {}
        for start, token in enumerate(tokens):
            for length in self._lengths.get(token, ()):
                key = tuple(tokens[start:start + length])
                if len(key) == length and key in self._ids:
                    found.setdefault(self._ids[key], None)
                    break
        return list(found)


def _occurrence_test(titles: Sequence[tuple[str, ...]]) -> Callable[[str], bool]:
    """A test of whether any of `titles` may occur in a text: never False where one does. A few
    titles: each of its words a substring of the lowercased text (a word of the text is one; the
    longest words, the rarest, are probed first); many: matched exactly, word by word."""
    if not titles:
        return lambda _text: False
    if len(titles) > MAX_SUBSTRING_PROBES:
        matcher = TitleMatcher(titles)
        return lambda text: bool(matcher.find(text))
    probes = [sorted(set(title), key=len, reverse=True) for title in titles]
    # one pass over the text for each title's longest word first: most texts hold none of them
    longest = sorted({probe[0] for probe in probes}, key=lambda word: (-len(word), word))
    candidates = re.compile("|".join(re.escape(word) for word in longest))

    def test(text: str) -> bool:
        lowered = text.lower()
        return candidates.search(lowered) is not None and any(all(word in lowered for word in probe)
                                                              for probe in probes)

    return test


@dataclass(frozen=True)
class GraphStats:
    passages: int
    entities: int
    mention_edges: int
    hubs: int


class EntityGraph:
    """Passages and the entities their titles name, linked by title and by mention.

    Nodes 0..P-1 are passages (in the order given), P..P+E-1 entities. The graph keeps the
    passages so that what a walk or a link reaches can be handed to the reader as it is.
    """

    def __init__(
        self,
        passages: Sequence[Passage],
        *,
        max_mention_share: float = MAX_MENTION_SHARE,
        min_hub_passages: int = MIN_HUB_PASSAGES,
        previous: EntityGraph | None = None,
    ) -> None:
        """`previous`: an earlier graph of the same knowledge base (`updated`); what it matched is
        reused where it cannot have changed, and the graph is the one a fresh build gives."""
        self.max_mention_share, self.min_hub_passages = max_mention_share, min_hub_passages
        self.passages = list(passages)
        self.passage_node = {p.id: node for node, p in enumerate(self.passages)}
        self.matcher = TitleMatcher(entity_key(p.title) for p in self.passages)
        entity_count = len(self.matcher.keys)
        # entity -> passages its title names
        titled: list[list[int]] = [[] for _ in range(entity_count)]
        own_entity = np.full(len(self.passages), -1, dtype=np.int64)
        for node, passage in enumerate(self.passages):
            key = entity_key(passage.title)
            if key:
                entity = self.matcher.keys[key]
                titled[entity].append(node)
                own_entity[node] = entity
        # every entity each passage mentions but its own, hubs included (what `updated` reuses)
        self._found = self._match(own_entity, previous)
        informative = np.array([_informative(key) for key in self.matcher.keys], dtype=bool)
        self.informative = informative
        mention_counts = Counter(e for found in self._found for e in found)
        hub_limit = max(min_hub_passages, int(max_mention_share * len(self.passages)))
        self.hubs = {e for e, n in mention_counts.items() if n > hub_limit}
        self.mentionable = informative.copy()
        if self.hubs:
            self.mentionable[list(self.hubs)] = False
        self.titled = titled
        self.mentions = [[e for e in found if self.mentionable[e]] for found in self._found]
        self._build_walk(own_entity)

    @classmethod
    def build(cls, passages: Iterable[Passage], **options: float) -> EntityGraph:
        return cls(list(passages), **options)  # type: ignore[arg-type]

    def updated(self, passages: Iterable[Passage]) -> EntityGraph:
        """The graph of the knowledge base after a write (upsert, delete, rebuild), given all its
        passages: the same graph a fresh build gives, but only the passages the write changed, and
        those that mention a title it added or removed, are matched again (`rematched`)."""
        return type(self)(list(passages), max_mention_share=self.max_mention_share,
                          min_hub_passages=self.min_hub_passages, previous=self)

    def _match(self, own_entity: np.ndarray, previous: EntityGraph | None) -> list[list[int]]:
        """Each passage's mentioned entities. A passage of `previous` with the same title and text
        keeps its list unless a title added or removed since occurs in it: at each word the matcher
        takes the longest known title starting there, so a title changes what it finds only where
        that title's words occur in sequence."""
        def matched(node: int, passage: Passage) -> list[int]:
            return [e for e in self.matcher.find(passage.text) if e != own_entity[node]]

        keys = self.matcher.keys
        if previous is None:
            self.rematched = len(self.passages)
            return [matched(node, p) for node, p in enumerate(self.passages)]
        before = previous.matcher.keys
        old_key = list(before)  # id -> key (ids are assigned in insertion order)
        changed = [key for key in keys if key not in before] + [key for key in before if key not in keys]
        touched = _occurrence_test(changed)
        found: list[list[int]] = []
        self.rematched = 0
        for node, passage in enumerate(self.passages):
            old = previous.passage_node.get(passage.id)
            if (old is not None and previous.passages[old].text == passage.text
                    and previous.passages[old].title == passage.title and not touched(passage.text)):
                found.append([keys[old_key[e]] for e in previous._found[old]])
            else:
                self.rematched += 1
                found.append(matched(node, passage))
        return found

    # ---- the walk -----------------------------------------------------------------------------

    def _build_walk(self, own_entity: np.ndarray) -> None:
        """The column-stochastic transition matrix of the undirected passage-entity graph, as CSR
        arrays by target node (row), for y = M @ x."""
        count = len(self.passages)
        sources, targets = [], []
        for node, entity in enumerate(own_entity):
            if entity >= 0:
                sources.append(node)
                targets.append(count + int(entity))
        for node, found in enumerate(self.mentions):
            sources.extend([node] * len(found))
            targets.extend(count + e for e in found)
        self.edge_count = len(sources)
        src = np.asarray(sources + targets, dtype=np.int64)  # both directions
        dst = np.asarray(targets + sources, dtype=np.int64)
        self.node_count = count + len(self.matcher.keys)
        degree = np.bincount(src, minlength=self.node_count).astype(np.float64)
        order = np.argsort(dst, kind="stable")
        self._columns = src[order]
        self._weights = 1.0 / degree[self._columns] if len(order) else np.zeros(0)
        self._row_starts = np.searchsorted(dst[order], np.arange(self.node_count))
        self._row_sizes = np.bincount(dst, minlength=self.node_count)
        self._dangling = degree == 0

    def _step(self, x: np.ndarray) -> np.ndarray:
        """M @ x: each node's mass spread evenly over its edges."""
        if not len(self._columns):
            return np.zeros_like(x)
        # a trailing 0 so rows without edges after the last edge still have a segment to read
        spread = np.append(self._weights * x[self._columns], 0.0)
        sums = np.add.reduceat(spread, self._row_starts)
        return np.where(self._row_sizes > 0, sums, 0.0)

    def personalized_pagerank(
        self, seeds: Mapping[int, float], damping: float = DAMPING, iterations: int = ITERATIONS
    ) -> np.ndarray:
        """Stationary visit probabilities of a walk restarting at `seeds` (node -> weight), for
        every node; the mass of nodes without edges returns to the seeds."""
        restart = np.zeros(self.node_count)
        for node, weight in seeds.items():
            restart[node] += weight
        total = restart.sum()
        if total <= 0:
            return restart
        restart /= total
        x = restart.copy()
        for _ in range(iterations):
            stuck = x[self._dangling].sum()
            x = (1 - damping) * restart + damping * (self._step(x) + stuck * restart)
        return x

    # ---- what the gatherers ask ----------------------------------------------------------------

    def entity_node(self, entity: int) -> int:
        return len(self.passages) + entity

    def question_entities(self, text: str) -> list[int]:
        """Informative entities mentioned in `text` (hubs included: a question naming one means it)."""
        return [e for e in self.matcher.find(text) if self.informative[e]]

    def linked(self, passage: Passage) -> list[Passage]:
        """Passages whose title `passage` mentions, in order of first mention."""
        node = self.passage_node.get(passage.id)
        mentioned = self.mentions[node] if node is not None else [
            e for e in self.matcher.find(passage.text) if self.mentionable[e]
        ]
        return [self.passages[n] for e in mentioned for n in self.titled[e] if n != node]

    def stats(self) -> GraphStats:
        return GraphStats(len(self.passages), len(self.matcher.keys), self.edge_count, len(self.hubs))

    def __len__(self) -> int:
        return len(self.passages)
