"""Each knowledge base's entity graph, built from its own index and kept per index version in the
process that reads it (a worker, the evaluation).

Why built here and not written beside the index at import time: the graph is a pure function of
the index's passages, so the index stays the one source of truth and nothing can disagree with
it. The same code serves tantivy and OpenSearch (an OpenSearch index has no directory to keep a
file in), and the knowledge-base writes (an import commits in batches of 200 documents) stay as
fast as they are. What it costs: each process that answers tier C builds the graphs of the
knowledge bases it serves, once per index version (reports/chain-reader/ measures a 100k-passage
build), and keeps at most `max_graphs` of them.

Versions: a retriever that can list its passages (`GraphSource`) names its knowledge base and the
version of its contents (tantivy: the generation and its last commit; a rebuild, upsert or delete
changes it). The first graph of a knowledge base is built on first use, the caller waiting; when a
write changes the version, the next caller starts a rebuild in a background thread and is handed
the previous graph until the new one is there (a passage reached through it may be one the write
changed or removed, for the seconds the rebuild takes). A build that fails is logged and not
retried until the version changes: the gatherers fall back to B's evidence meanwhile.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Protocol, runtime_checkable

from adaptive_rag.domain import Passage
from adaptive_rag.evidence.graph import EntityGraph

log = logging.getLogger(__name__)

DEFAULT_MAX_GRAPHS = 8


@runtime_checkable
class GraphSource(Protocol):
    """A retriever that can hand over its whole knowledge base (the graph is built from it)."""

    def corpus_id(self) -> str:
        """Which knowledge base: the same for every retriever opened on it."""
        ...

    def corpus_version(self) -> str:
        """Changes whenever its passages do."""
        ...

    def corpus_passages(self) -> Iterable[Passage]:
        """Every passage of the knowledge base."""
        ...


@dataclass(frozen=True)
class GraphLookup:
    """The graph to walk (None: none there) and a line for the strategy's steps saying which."""

    graph: EntityGraph | None
    note: str


@dataclass
class _Entry:
    version: str = ""
    graph: EntityGraph | None = None
    graph_version: str = ""
    building: str = ""            # the version being built ("" when none)
    failed: str = ""              # the version whose build failed
    done: threading.Event = field(default_factory=threading.Event)


class EntityGraphs:
    """At most `max_graphs` knowledge bases' graphs (least recently used dropped), each of the
    latest version asked for. Thread-safe: one build per knowledge base at a time."""

    def __init__(
        self,
        max_graphs: int = DEFAULT_MAX_GRAPHS,
        build: Callable[[list[Passage]], EntityGraph] = EntityGraph,
        background: bool = True,
    ) -> None:
        self.max_graphs = max_graphs
        self._build = build
        self._background = background
        self._entries: OrderedDict[str, _Entry] = OrderedDict()
        self._lock = threading.Lock()

    def lookup(self, retriever: object) -> GraphLookup:
        """The graph of `retriever`'s knowledge base, building or refreshing it as needed."""
        if not isinstance(retriever, GraphSource):
            return GraphLookup(None, "entity graph: the retriever cannot list its passages")
        key, version = retriever.corpus_id(), retriever.corpus_version()
        with self._lock:
            entry = self._entries.get(key)
            if entry is None:
                entry = self._entries[key] = _Entry()
                while len(self._entries) > self.max_graphs:
                    self._entries.popitem(last=False)
            self._entries.move_to_end(key)
            entry.version = version
            if entry.graph is not None and entry.graph_version == version:
                return GraphLookup(entry.graph, _described(entry.graph))
            start = entry.building != version and entry.failed != version
            if start:
                entry.building = version
                entry.done = threading.Event()
            waiting_for = entry.done
            stale = entry.graph
        if start:
            if stale is not None and self._background:
                threading.Thread(target=self._refresh, args=(entry, retriever, version, waiting_for),
                                 name=f"entity-graph {key}", daemon=True).start()
            else:
                self._refresh(entry, retriever, version, waiting_for)
        if stale is not None:
            return GraphLookup(stale, _described(stale) + ", of an earlier version of the knowledge "
                               "base (the current one's is being built)")
        waiting_for.wait()
        with self._lock:
            graph, built = entry.graph, entry.graph_version
        if graph is None:
            return GraphLookup(None, "entity graph: could not be built (see the worker's log)")
        return GraphLookup(graph, _described(graph) if built == version else _described(graph)
                           + ", of an earlier version of the knowledge base")

    def _refresh(self, entry: _Entry, source: GraphSource, version: str, done: threading.Event) -> None:
        started = time.perf_counter()
        try:
            graph = self._build(list(source.corpus_passages()))
        except Exception:  # noqa: BLE001 - a graph is an aid: answer without it, say so in the log
            log.exception("entity graph build failed for %s (version %s)", source.corpus_id(), version)
            with self._lock:
                entry.failed = version
                if entry.building == version:
                    entry.building = ""
            done.set()
            return
        with self._lock:
            entry.graph, entry.graph_version = graph, version
            if entry.building == version:
                entry.building = ""
        done.set()
        log.info("entity graph of %s built: %d passages in %.1f s", source.corpus_id(), len(graph),
                 time.perf_counter() - started)


def _described(graph: EntityGraph) -> str:
    stats = graph.stats()
    return f"entity graph: {stats.passages} passages, {stats.entities} entities"


_shared: EntityGraphs | None = None
_shared_lock = threading.Lock()


def shared_graphs(max_graphs: int = DEFAULT_MAX_GRAPHS) -> EntityGraphs:
    """This process's graphs, one cache for every strategy built in it."""
    global _shared
    with _shared_lock:
        if _shared is None:
            _shared = EntityGraphs(max_graphs)
        return _shared
