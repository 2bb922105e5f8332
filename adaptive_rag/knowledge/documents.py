"""What a tenant brings (`Document`, `Section`) and the port its index is kept behind."""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from adaptive_rag.domain import Passage
from adaptive_rag.ports import Retriever


@dataclass(frozen=True, slots=True)
class Section:
    """A headed part of a document (Markdown heading, FAQ answer...); `heading` may be empty."""

    heading: str
    text: str


@dataclass(frozen=True, slots=True)
class Document:
    """One help-centre article or FAQ entry.

    `id` is the tenant's stable id for it: importing it again replaces it in place. `source` names
    what it was imported from (a file name, "api"), so a re-import of that source can remove the
    documents that are no longer in it.
    """

    id: str
    title: str
    sections: tuple[Section, ...]
    url: str = ""
    source: str = ""
    metadata: Mapping[str, str] = field(default_factory=dict)

    @property
    def text(self) -> str:
        return "\n\n".join(s.text for s in self.sections if s.text)


class KnowledgeIndex(Protocol):
    """One BM25 index per tenant, kept current without downtime (OpenSearch, embedded tantivy).

    Chunks are `Passage`s whose id is `<document id>#<position>`, with `doc_id` and `section` set.
    Every call is scoped to one tenant; nothing crosses tenants.
    """

    def upsert(self, tenant: str, chunks: Sequence[Passage]) -> None:
        """Add or replace these chunks (by id); visible to searches when the call returns."""
        ...

    def delete(self, tenant: str, chunk_ids: Iterable[str]) -> None:
        """Remove these chunks (unknown ids are ignored); visible when the call returns."""
        ...

    def rebuild(self, tenant: str, chunks: Iterable[Passage]) -> int:
        """Build a fresh index from `chunks` beside the live one, then switch to it atomically
        (searches keep answering from the old one until the switch); returns the new generation."""
        ...

    def exists(self, tenant: str) -> bool: ...

    def count(self, tenant: str) -> int:
        """Number of chunks in the tenant's live index (0 when it has none)."""
        ...

    def retriever(self, tenant: str) -> Retriever:
        """A retriever over the tenant's live index that follows later upserts and rebuilds.

        Raises `IndexNotFoundError` when the tenant has no index.
        """
        ...


def normalise_title(text: str) -> str:
    """Lower-cased, whitespace-collapsed text: the key a derived document id is made from."""
    return " ".join(text.lower().split())


def derived_document_id(key: str, prefix: str = "doc") -> str:
    """A stable id for a document its source gives none (a CSV FAQ row: its question), so a
    re-import of the same entry replaces it in place."""
    return f"{prefix}-{hashlib.sha256(normalise_title(key).encode()).hexdigest()[:16]}"
