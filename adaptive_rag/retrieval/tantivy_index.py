"""Embedded BM25 retriever: a persistent tantivy index on disk.

User text never reaches tantivy's query parser (it raises on `a AND (b`, `"unclosed`, `title:x`
...). Instead the query is run through the same analyzer the index uses (tokenise, lowercase,
drop English stop words, Porter-stem) and the resulting terms are OR-ed as term queries over
`title` and `section` (both boosted) and `text`, which is BM25 over the fields like OpenSearch's
`most_fields`.

Fields: `id` and `doc_id` are raw (one exact term each: deletes by id, filters by document);
`title`, `section` and `text` are analysed. A section heading names what its chunk is about the
way a title names its document, so it is searched with the title's boost; it is a separate field
(not folded into `text`) so a short heading keeps its own length normalisation.

Freshness: another writer (this process or another) commits by replacing `meta.json`. A search
first `stat`s it (a few microseconds) and reloads the reader only when it changed, so a commit is
visible to the next search without paying a reload (tens of microseconds, growing with the
segment count) on every query. tantivy's own on-commit watcher (a poll every 500 ms) stays on as
a backstop.
"""

from __future__ import annotations

import json
import os
import shutil
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path

import tantivy

from adaptive_rag.domain import Passage
from adaptive_rag.errors import AdaptiveRagError, IndexNotFoundError, KnowledgeBaseBusyError

ANALYZER_NAME = "arag_english"
# Bound on distinct query terms: a 10 KB paste still runs in milliseconds.
MAX_QUERY_TERMS = 64
_WRITER_HEAP_BYTES = 128 * 1024 * 1024
META_FILE = "meta.json"
# Attempts at reloading when a concurrent commit garbage-collects files between reading
# meta.json and opening its segments.
_RELOAD_ATTEMPTS = 3


def english_analyzer() -> tantivy.TextAnalyzer:
    """The analyzer for indexing and querying, close to OpenSearch's `english` analyzer."""
    return (
        tantivy.TextAnalyzerBuilder(tantivy.Tokenizer.simple())
        .filter(tantivy.Filter.remove_long(40))
        .filter(tantivy.Filter.lowercase())
        .filter(tantivy.Filter.stopword("english"))
        .filter(tantivy.Filter.stemmer("english"))
        .build()
    )


def _schema() -> tantivy.Schema:
    builder = tantivy.SchemaBuilder()
    builder.add_text_field("id", stored=True, tokenizer_name="raw")
    builder.add_text_field("doc_id", stored=True, tokenizer_name="raw")
    builder.add_text_field("title", stored=True, tokenizer_name=ANALYZER_NAME)
    builder.add_text_field("section", stored=True, tokenizer_name=ANALYZER_NAME)
    builder.add_text_field("text", stored=True, tokenizer_name=ANALYZER_NAME)
    return builder.build()


def _document(passage: Passage) -> tantivy.Document:
    return tantivy.Document(
        id=passage.id, doc_id=passage.doc_id, title=passage.title,
        section=passage.section, text=passage.text,
    )


def _field_names(index_dir: Path) -> set[str]:
    """Fields of the index on disk: indexes built before `doc_id`/`section` still open."""
    meta = json.loads((index_dir / META_FILE).read_text(encoding="utf-8"))
    return {field["name"] for field in meta["schema"]}


def file_stamp(path: Path) -> tuple[int, int, int, int] | None:
    """What changes when tantivy replaces `path` (a new inode, mtime, size); None if missing."""
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return None
    return (st.st_ino, st.st_mtime_ns, st.st_ctime_ns, st.st_size)


def _lock_busy(err: Exception) -> bool:
    return "LockBusy" in str(err)


@contextmanager
def _committing(writer: tantivy.IndexWriter) -> Iterator[tantivy.IndexWriter]:
    """One commit of what the block writes, rolled back if it raises; either way the writer is
    dropped after (its lock released, its files closed)."""
    try:
        yield writer
        writer.commit()
    except BaseException:
        writer.rollback()
        raise
    finally:
        writer.wait_merging_threads()


def _write_index(
    index_dir: Path, passages: Iterable[Passage], on_progress: Callable[[int], None] | None
) -> None:
    """A fresh index of `passages` in the empty `index_dir`, committed; on failure the writer is
    rolled back and dropped before the caller removes the directory."""
    index = tantivy.Index(_schema(), path=str(index_dir), reuse=False)
    index.register_tokenizer(ANALYZER_NAME, english_analyzer())
    with _committing(index.writer(_WRITER_HEAP_BYTES, 1)) as writer:
        seen: set[str] = set()
        for passage in passages:
            if passage.id in seen:
                # A delete applies to documents added before it, committed or not.
                writer.delete_documents_by_term("id", passage.id)
            seen.add(passage.id)
            writer.add_document(_document(passage))
            if on_progress:
                on_progress(1)


def _process_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # someone else's process: alive
        return True
    return True


def _sweep_abandoned(index_dir: Path) -> None:
    """Remove the staging and retired directories beside `index_dir` left by builds whose process
    is gone (killed outright, no clean-up ran); a live build's are left alone."""
    for kind in ("building", "retired"):
        for leftover in index_dir.parent.glob(f".{index_dir.name}.{kind}-*"):
            pid = leftover.name.rsplit("-", 1)[-1]
            if pid.isdigit() and int(pid) != os.getpid() and not _process_alive(int(pid)):
                shutil.rmtree(leftover, ignore_errors=True)


def _swap_in(built: Path, index_dir: Path) -> None:
    """Put the complete index `built` at `index_dir`: the old one is renamed away first (a reader
    finds no index for that instant, never a partial one), then removed; its open memory maps stay
    readable until the readers reload."""
    retired = index_dir.with_name(f".{index_dir.name}.retired-{os.getpid()}")
    if retired.exists():
        shutil.rmtree(retired)
    if index_dir.exists():
        index_dir.rename(retired)
    built.rename(index_dir)
    shutil.rmtree(retired, ignore_errors=True)


class TantivyRetriever:
    """BM25 over a tantivy index directory built by `TantivyRetriever.build`.

    Thread-safe; sees commits made by other `TantivyRetriever`s or processes on the next search.
    """

    def __init__(self, index_dir: Path, *, title_boost: float = 2.0) -> None:
        index_dir = Path(index_dir)
        if not (index_dir / META_FILE).exists():
            raise IndexNotFoundError(
                f"no tantivy index in {index_dir}; build one with `arag index CORPUS.jsonl`"
            )
        self.index_dir = index_dir
        self.title_boost = title_boost
        self._meta = index_dir / META_FILE
        self._analyzer = english_analyzer()
        try:
            # `open` never creates: a directory being removed fails here instead of getting a
            # fresh empty index.
            self._index = tantivy.Index.open(str(index_dir))
            fields = _field_names(index_dir)
        except (OSError, ValueError) as err:
            raise IndexNotFoundError(f"cannot open the tantivy index in {index_dir}: {err}") from err
        self._index.register_tokenizer(ANALYZER_NAME, self._analyzer)
        self._schema = self._index.schema
        self._has_kb_fields = {"doc_id", "section"} <= fields
        self._reload_lock = threading.Lock()
        self._meta_stamp = file_stamp(self._meta)
        self._index.reload()

    @classmethod
    def build(
        cls,
        index_dir: Path,
        passages: Iterable[Passage],
        on_progress: Callable[[int], None] | None = None,
        *,
        title_boost: float = 2.0,
    ) -> TantivyRetriever:
        """(Re)create the index at `index_dir` from `passages`; `on_progress(n)` after each doc.

        A passage id seen again replaces the earlier passage (last one wins). The index is built
        beside `index_dir` and swapped in whole, so a reader open on `index_dir` (a worker, an
        evaluation) answers from the old index until the new one is complete, never from a
        half-built or empty one.
        """
        index_dir = Path(index_dir)
        staging = index_dir.with_name(f".{index_dir.name}.building-{os.getpid()}")
        _sweep_abandoned(index_dir)
        if staging.exists():
            shutil.rmtree(staging)
        staging.mkdir(parents=True)
        try:
            _write_index(staging, passages, on_progress)
            _swap_in(staging, index_dir)
        except BaseException:
            shutil.rmtree(staging, ignore_errors=True)
            raise
        return cls(index_dir, title_boost=title_boost)

    # ---- incremental maintenance ------------------------------------------------------------

    def upsert(self, passages: Iterable[Passage]) -> int:
        """Add or replace `passages` by id in one commit; visible to searches on return.

        Raises `KnowledgeBaseBusyError` when another writer holds the index.
        """
        batch = list(passages)
        if not batch:
            return 0
        self._require_kb_fields()
        for passage in batch:
            if not passage.id:
                raise ValueError(f"a passage needs an id to be upserted: {passage!r}")
        with _committing(self._writer()) as writer:
            for passage in batch:
                # delete-then-add per passage: a later duplicate in `batch` wins as well
                writer.delete_documents_by_term("id", passage.id)
                writer.add_document(_document(passage))
        self._refresh()
        return len(batch)

    def delete(self, ids: Iterable[str]) -> None:
        """Remove the passages with these ids (unknown ids are ignored) in one commit."""
        batch = [i for i in dict.fromkeys(ids) if i]
        if not batch:
            return
        with _committing(self._writer()) as writer:
            for passage_id in batch:
                writer.delete_documents_by_term("id", passage_id)
        self._refresh()

    def _writer(self) -> tantivy.IndexWriter:
        try:
            return self._index.writer(_WRITER_HEAP_BYTES, 1)
        except ValueError as err:
            if _lock_busy(err):
                raise KnowledgeBaseBusyError(
                    f"another writer holds the tantivy index in {self.index_dir} (an import or "
                    "rebuild running in this or another process); retry when it has finished"
                ) from err
            raise

    def _require_kb_fields(self) -> None:
        if not self._has_kb_fields:
            raise AdaptiveRagError(
                f"the tantivy index in {self.index_dir} predates the doc_id/section fields; "
                "rebuild it before upserting into it"
            )

    # ---- queries ----------------------------------------------------------------------------

    def _refresh(self) -> None:
        """Reload the reader now (after our own commit)."""
        with self._reload_lock:
            stamp = file_stamp(self._meta)
            self._reload()
            self._meta_stamp = stamp

    def _reload(self) -> None:
        for attempt in range(_RELOAD_ATTEMPTS):
            try:
                self._index.reload()
                return
            except ValueError:
                # files of the meta.json just read were merged away by a concurrent commit
                if attempt == _RELOAD_ATTEMPTS - 1:
                    raise
                time.sleep(0.01 * (attempt + 1))

    def changed_on_disk(self) -> bool:
        """Whether a commit happened since the reader last loaded (or the index was removed)."""
        return file_stamp(self._meta) != self._meta_stamp

    def _searcher(self) -> tantivy.Searcher:
        """The reader's searcher, reloaded first when meta.json changed since the last load."""
        stamp = file_stamp(self._meta)
        if stamp is not None and stamp != self._meta_stamp:
            with self._reload_lock:
                if stamp != self._meta_stamp:
                    # stat before reload: a commit in between only costs one more reload later
                    self._reload()
                    self._meta_stamp = stamp
        # stamp None: the directory was removed (an old generation); its open mmaps stay
        # readable, so keep answering from what is loaded.
        return self._index.searcher()

    def count(self) -> int:
        return self._searcher().num_docs

    # ---- the whole corpus (what the entity graph is built from) -------------------------------

    def corpus_id(self) -> str:
        """Which index this is, the same for every retriever opened on it."""
        return str(self.index_dir.resolve())

    def corpus_version(self) -> str:
        """Changes with every commit (tantivy replaces meta.json), so a graph built from an older
        version is known to be stale."""
        stamp = file_stamp(self._meta)
        return "-" if stamp is None else "-".join(str(part) for part in stamp)

    def corpus_passages(self) -> Iterator[Passage]:
        """Every passage in the index, in no particular order, from one consistent searcher."""
        searcher = self._searcher()
        total = searcher.num_docs
        if not total:
            return
        for _, address in searcher.search(tantivy.Query.all_query(), total).hits:
            doc = searcher.doc(address)
            yield Passage(
                id=doc.get_first("id"), title=doc.get_first("title") or "", text=doc.get_first("text") or "",
                doc_id=(doc.get_first("doc_id") or "") if self._has_kb_fields else "",
                section=(doc.get_first("section") or "") if self._has_kb_fields else "",
            )

    def query_terms(self, query: str) -> list[str]:
        """Distinct analysed terms of `query`, in order of first appearance, bounded."""
        seen: dict[str, None] = {}
        for term in self._analyzer.analyze(query):
            seen.setdefault(term, None)
            if len(seen) >= MAX_QUERY_TERMS:
                break
        return list(seen)

    def query_weight(self, query: str) -> float:
        """The summed BM25 idf of `query`'s distinct terms (`ports.QueryWeigher`); a term's
        document frequency is its largest in any searched field."""
        from adaptive_rag.retrieval.relevance import bm25_idf

        terms = self.query_terms(query)
        if not terms:
            return 0.0
        searcher = self._searcher()
        fields = ("title", "section", "text") if self._has_kb_fields else ("title", "text")
        docs = searcher.num_docs
        return sum(bm25_idf(max(searcher.doc_freq(field, term) for field in fields), docs) for term in terms)

    def search(self, query: str, k: int) -> list[Passage]:
        terms = self.query_terms(query)
        if not terms or k <= 0:
            return []
        boosted = ("title", "section") if self._has_kb_fields else ("title",)
        clauses = []
        for term in terms:
            for field in boosted:
                clause = tantivy.Query.term_query(self._schema, field, term)
                clauses.append((tantivy.Occur.Should, tantivy.Query.boost_query(clause, self.title_boost)))
            clauses.append((tantivy.Occur.Should, tantivy.Query.term_query(self._schema, "text", term)))
        searcher = self._searcher()
        hits = searcher.search(tantivy.Query.boolean_query(clauses), k).hits
        passages = []
        for score, address in hits:
            doc = searcher.doc(address)
            passages.append(
                Passage(
                    id=doc.get_first("id"),
                    title=doc.get_first("title") or "",
                    text=doc.get_first("text") or "",
                    score=float(score),
                    doc_id=(doc.get_first("doc_id") or "") if self._has_kb_fields else "",
                    section=(doc.get_first("section") or "") if self._has_kb_fields else "",
                )
            )
        return passages

    def __repr__(self) -> str:
        return f"TantivyRetriever({str(self.index_dir)!r})"
