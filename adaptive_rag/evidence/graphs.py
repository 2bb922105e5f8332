"""Each knowledge base's entity graph, built from its own index and kept per index version in the
process that reads it (a worker, the evaluation).

Why built here and not written beside the index at import time: the graph is a pure function of
the index's passages, so the index stays the one source of truth and nothing can disagree with
it. The same code serves tantivy and OpenSearch (an OpenSearch index has no directory to keep a
file in), and the knowledge-base writes (an import commits in batches) stay as fast as they are.
What it costs: each process that answers with a graph-walking gatherer builds the graphs of the
knowledge bases it serves, once per version of their contents, and keeps at most `max_graphs`.

Lifecycle (the cheapest approach that never hands a passage a write changed or removed):
- a retriever that can list its passages (`GraphSource`) names its knowledge base and the
  version of its contents (tantivy: the generation and its last commit; OpenSearch: the indices
  behind the alias and their shards' sequence numbers); an import, rebuild, upsert or delete
  changes the version;
- every lookup compares the version (one file stat, or one stats request): a graph of another
  version is dropped at once (invalidated), never walked;
- a missing graph is built on first use: in the background when `background` (a worker: the
  request is answered without the graph meanwhile, its steps say so), else the caller waits (the
  evaluation, tests). One build per knowledge base at a time; a version that changed during a
  build is built by the next lookup;
- a build after a write updates the invalidated graph (`EntityGraph.updated`, kept for that and
  never walked): every passage is listed again, but only those the write changed, and those that
  mention a title it added or removed, are matched again; the result is the graph a fresh build
  gives;
- a build that fails is logged and not retried until the version changes.
"""

from __future__ import annotations

import logging
import os
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
    graph: EntityGraph | None = None
    graph_version: str = ""
    previous: EntityGraph | None = None  # the graph a write invalidated, which the next build updates
    building: str = ""  # the version being built ("" when none)
    failed: str = ""  # the version whose build failed
    done: threading.Event = field(default_factory=threading.Event)


class EntityGraphs:
    """At most `max_graphs` knowledge bases' graphs (least recently used dropped), each of the
    current version of its knowledge base. Thread-safe."""

    def __init__(
        self,
        max_graphs: int = DEFAULT_MAX_GRAPHS,
        build: Callable[[list[Passage]], EntityGraph] = EntityGraph,
        background: bool = True,
        update: Callable[[EntityGraph, list[Passage]], EntityGraph] | None = None,
    ) -> None:
        """`build`: a graph from every passage; `update`: the graph after a write from the graph
        before it (default: `EntityGraph.updated` when `build` is the default)."""
        self.max_graphs = max_graphs
        self._build = build
        self._update = update if update is not None else (EntityGraph.updated if build is EntityGraph else None)
        # Build in a thread and answer without the graph meanwhile (serving), or wait for it.
        self.background = background
        self._entries: OrderedDict[str, _Entry] = OrderedDict()
        self._lock = threading.Lock()
        self.builds = 0  # builds started (a measure of how often writes invalidate)

    def warm(self, retriever: object) -> GraphLookup:
        """`lookup`, waiting for the build (a worker or an evaluation about to serve the knowledge
        base, so that its first questions are answered with the graph)."""
        return self.lookup(retriever, wait=True)

    def lookup(self, retriever: object, wait: bool | None = None) -> GraphLookup:
        """The graph of `retriever`'s knowledge base at its current version, or None and why.
        `wait` (default: not `background`): wait for a build rather than answer without it."""
        wait = (not self.background) if wait is None else wait
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
            if entry.graph is not None and entry.graph_version == version:
                return GraphLookup(entry.graph, _described(entry.graph))
            if entry.graph is not None:  # a write changed the knowledge base: invalidated
                entry.previous, entry.graph, entry.graph_version = entry.graph, None, ""
            if entry.failed == version:
                return GraphLookup(None, "entity graph: its build failed for this version of the "
                                         "knowledge base (see the log)")
            start = not entry.building
            if start:
                entry.building, entry.done = version, threading.Event()
                self.builds += 1
            waiting_for, in_flight = entry.done, entry.building
        if start and not wait:
            threading.Thread(target=self._refresh, args=(entry, retriever, version, waiting_for),
                             name=f"entity-graph {key}", daemon=True).start()
        elif start:
            self._refresh(entry, retriever, version, waiting_for)
        if not wait:
            return GraphLookup(None, "entity graph: being built for this version of the knowledge base")
        waiting_for.wait()
        with self._lock:
            graph, built = entry.graph, entry.graph_version
        if graph is not None and built == version:
            return GraphLookup(graph, _described(graph))
        if in_flight != version:  # waited for a build of an earlier version: build this one now
            return self.lookup(retriever, wait)
        return GraphLookup(None, "entity graph: its build failed for this version of the knowledge "
                                 "base (see the log)")

    def _refresh(self, entry: _Entry, source: GraphSource, version: str, done: threading.Event) -> None:
        started = time.perf_counter()
        with self._lock:
            previous = entry.previous
        updating = previous is not None and self._update is not None
        try:
            passages = list(source.corpus_passages())
            graph = self._updated(previous, passages, source) if previous is not None and updating else None
            if graph is None:  # a first build, or an update that failed
                graph = self._build(passages)
        except Exception:  # noqa: BLE001 - a graph is an aid: answer without it, say so in the log
            log.exception("entity graph build failed for %s (version %s)", source.corpus_id(), version)
            with self._lock:
                entry.failed, entry.building = version, ""
            done.set()
            return
        with self._lock:
            entry.graph, entry.graph_version, entry.building, entry.previous = graph, version, "", None
        done.set()
        log.info("entity graph of %s %s: %d passages, %s of them matched, in %.1f s", source.corpus_id(),
                 "updated" if updating else "built", len(graph), getattr(graph, "rematched", "all"),
                 time.perf_counter() - started)

    def _updated(self, previous: EntityGraph, passages: list[Passage], source: GraphSource) -> EntityGraph | None:
        """The update of `previous`, or None when it fails (then a fresh build is tried: a fault in
        the update must not leave the knowledge base without a graph)."""
        assert self._update is not None
        try:
            return self._update(previous, passages)
        except Exception:  # noqa: BLE001 - logged, and the fresh build follows
            log.exception("entity graph update failed for %s; building it afresh", source.corpus_id())
            return None


def _described(graph: EntityGraph) -> str:
    stats = graph.stats()
    return f"entity graph: {stats.passages} passages, {stats.entities} entities"


_shared: EntityGraphs | None = None
_shared_pid = 0
_shared_lock = threading.Lock()


def shared_graphs(max_graphs: int = DEFAULT_MAX_GRAPHS, background: bool | None = None) -> EntityGraphs:
    """This process's graphs, one cache for every strategy built in it. By default a caller waits
    for a build (a CLI, an evaluation); a serving process sets `background=True` once, so that no
    request waits for one. A forked child gets its own (a build thread does not survive a fork)."""
    global _shared, _shared_pid
    with _shared_lock:
        if _shared is None or _shared_pid != os.getpid():
            _shared, _shared_pid = EntityGraphs(max_graphs, background=False), os.getpid()
        if background is not None:
            _shared.background = background
        return _shared
