"""Embedded BM25 retriever: a persistent tantivy index on disk.

User text never reaches tantivy's query parser (it raises on `a AND (b`, `"unclosed`, `title:x`
...). Instead the query is run through the same analyzer the index uses (tokenise, lowercase,
drop English stop words, Porter-stem) and the resulting terms are OR-ed as term queries over
`title` (boosted) and `text`, which is BM25 over both fields like OpenSearch's `most_fields`.
"""

from __future__ import annotations

import shutil
from collections.abc import Callable, Iterable
from pathlib import Path

import tantivy

from adaptive_rag.domain import Passage
from adaptive_rag.errors import IndexNotFoundError

ANALYZER_NAME = "arag_english"
# Bound on distinct query terms: a 10 KB paste still runs in milliseconds.
MAX_QUERY_TERMS = 64
_WRITER_HEAP_BYTES = 128 * 1024 * 1024


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
    builder.add_text_field("title", stored=True, tokenizer_name=ANALYZER_NAME)
    builder.add_text_field("text", stored=True, tokenizer_name=ANALYZER_NAME)
    return builder.build()


class TantivyRetriever:
    """BM25 over a tantivy index directory built by `TantivyRetriever.build`."""

    def __init__(self, index_dir: Path, *, title_boost: float = 2.0) -> None:
        index_dir = Path(index_dir)
        if not (index_dir / "meta.json").exists():
            raise IndexNotFoundError(
                f"no tantivy index in {index_dir}; build one with `arag index CORPUS.jsonl`"
            )
        self.index_dir = index_dir
        self.title_boost = title_boost
        self._schema = _schema()
        self._analyzer = english_analyzer()
        self._index = tantivy.Index(self._schema, path=str(index_dir), reuse=True)
        self._index.register_tokenizer(ANALYZER_NAME, self._analyzer)
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
        """(Re)create the index at `index_dir` from `passages`; `on_progress(n)` after each doc."""
        index_dir = Path(index_dir)
        if index_dir.exists():
            shutil.rmtree(index_dir)
        index_dir.mkdir(parents=True)
        index = tantivy.Index(_schema(), path=str(index_dir), reuse=False)
        index.register_tokenizer(ANALYZER_NAME, english_analyzer())
        writer = index.writer(_WRITER_HEAP_BYTES, 1)
        for passage in passages:
            writer.add_document(
                tantivy.Document(id=passage.id, title=passage.title, text=passage.text)
            )
            if on_progress:
                on_progress(1)
        writer.commit()
        writer.wait_merging_threads()
        return cls(index_dir, title_boost=title_boost)

    def count(self) -> int:
        return self._index.searcher().num_docs

    def query_terms(self, query: str) -> list[str]:
        """Distinct analysed terms of `query`, in order of first appearance, bounded."""
        seen: dict[str, None] = {}
        for term in self._analyzer.analyze(query):
            seen.setdefault(term, None)
            if len(seen) >= MAX_QUERY_TERMS:
                break
        return list(seen)

    def search(self, query: str, k: int) -> list[Passage]:
        terms = self.query_terms(query)
        if not terms or k <= 0:
            return []
        clauses = []
        for term in terms:
            title = tantivy.Query.term_query(self._schema, "title", term)
            clauses.append((tantivy.Occur.Should, tantivy.Query.boost_query(title, self.title_boost)))
            clauses.append((tantivy.Occur.Should, tantivy.Query.term_query(self._schema, "text", term)))
        searcher = self._index.searcher()
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
                )
            )
        return passages
