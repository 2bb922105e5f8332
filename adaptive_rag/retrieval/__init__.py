"""Retriever adapters (embedded tantivy, OpenSearch) and the factory that picks one from settings."""

from __future__ import annotations

from collections.abc import Callable, Iterable

from adaptive_rag.domain import Passage
from adaptive_rag.errors import ConfigurationError
from adaptive_rag.ports import Retriever
from adaptive_rag.settings import Settings


def _opensearch_url(settings: Settings) -> str:
    if not settings.opensearch_url:
        raise ConfigurationError("ARAG_RETRIEVER=opensearch needs OPENSEARCH_URL")
    return settings.opensearch_url


def open_retriever(settings: Settings) -> Retriever:
    """The configured retriever over an index that already exists.

    Fails fast (before any model is loaded) with `IndexNotFoundError` or
    `RetrieverUnavailableError` when the index or the cluster is not there.
    """
    if settings.retriever == "opensearch":
        from adaptive_rag.retrieval.opensearch import OpenSearchRetriever

        retriever = OpenSearchRetriever(
            _opensearch_url(settings), settings.opensearch_index,
            title_boost=settings.title_boost, timeout_s=settings.opensearch_timeout_s,
        )
        retriever.count()  # raises when the cluster or the index is missing
        return retriever
    from adaptive_rag.retrieval.tantivy_index import TantivyRetriever

    return TantivyRetriever(settings.index_dir, title_boost=settings.title_boost)


def build_index(
    settings: Settings,
    passages: Iterable[Passage],
    on_progress: Callable[[int], None] | None = None,
) -> Retriever:
    """(Re)build the configured backend's index from `passages` and return its retriever."""
    if settings.retriever == "opensearch":
        from adaptive_rag.retrieval.opensearch import OpenSearchRetriever

        retriever = OpenSearchRetriever(
            _opensearch_url(settings), settings.opensearch_index,
            title_boost=settings.title_boost, timeout_s=settings.opensearch_timeout_s,
        )
        retriever.build(passages, on_progress)
        return retriever
    from adaptive_rag.retrieval.tantivy_index import TantivyRetriever

    return TantivyRetriever.build(
        settings.index_dir, passages, on_progress, title_boost=settings.title_boost
    )
