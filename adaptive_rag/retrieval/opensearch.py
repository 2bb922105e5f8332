"""BM25 retrieval over an OpenSearch index (opensearch-py): the production twin of
`TantivyRetriever`; both pass one contract suite (`tests/integration/test_retriever_contract.py`).

- One index per corpus: `id` (keyword, also `_id`) and `doc_id` (keyword: deletes and filters by
  document), `title`, `section` and `text` with the `english` analyzer, BM25 (k1 1.2, b 0.75),
  1 shard and 0 replicas by default; `dynamic: strict`.
- User text never reaches a query-string parser: it goes into a `multi_match` (`most_fields`,
  operator OR) over `title^boost`, `section^boost` and `text`, which adds the per-field BM25
  scores like the embedded retriever does. A section heading names its chunk's subject the way a
  title names its document, hence the same boost; indexes made before `section` existed answer
  the same (a missing field matches nothing).
- Long queries are cut to `max_query_tokens` (Lucene bounds a query's clauses at 1024; three per
  token here); a clause-limit rejection is retried once with fewer tokens, else answered empty:
  no query text raises.
- `upsert`/`delete` go through bulk (429s retried with backoff) with `refresh=wait_for`, so a
  returned call is visible to searches; the index may be an alias (`require_alias`).
- An unreachable cluster raises `RetrieverUnavailableError`; a missing index `IndexNotFoundError`.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from typing import Any
from urllib.parse import urlsplit, urlunsplit

from opensearchpy import OpenSearch
from opensearchpy import exceptions as os_exc
from opensearchpy.helpers import streaming_bulk

from adaptive_rag.domain import Passage
from adaptive_rag.errors import (
    AdaptiveRagError,
    ConfigurationError,
    IndexNotFoundError,
    RetrieverUnavailableError,
)

log = logging.getLogger(__name__)

MAX_QUERY_TOKENS = 256
MAX_QUERY_CHARS = 4096
# Lucene's standard tokenizer splits longer runs every 255 characters.
_STANDARD_MAX_TOKEN_LENGTH = 255
# Elasticsearch/OpenSearch hard limit on from + size.
_MAX_RESULT_WINDOW = 10_000
_BUILD_HINT = "build it with `arag index --retriever opensearch`"
_SOURCE_FIELDS = ["id", "doc_id", "title", "section", "text"]

# One token per CJK ideograph / kana / hangul syllable (the standard tokenizer emits them one by
# one or in short words), one per other non-space symbol outside ASCII (emoji are tokens), and
# one per run of word characters otherwise. Over-counting is harmless: it only shortens the query.
_CJK = "\u1100-\u11ff\u3040-\u30ff\u3100-\u312f\u3130-\u318f\u3400-\u4dbf\u4e00-\u9fff\uac00-\ud7af\uf900-\ufaff"
_TOKEN_RE = re.compile(rf"[{_CJK}]|[^\W{_CJK}]+|[^\w\s\x00-\x7f]")
_INDEX_NAME_FORBIDDEN = re.compile(r'[\\/*?"<>| ,#:A-Z]')


def bound_query(text: str, max_tokens: int = MAX_QUERY_TOKENS, max_chars: int = MAX_QUERY_CHARS) -> str:
    """`text` cut after at most `max_tokens` (conservatively counted) tokens and `max_chars`."""
    text = text[:max_chars]
    used = 0
    for match in _TOKEN_RE.finditer(text):
        length = match.end() - match.start()
        cost = -(-length // _STANDARD_MAX_TOKEN_LENGTH)  # ceil
        if used + cost > max_tokens:
            if used == 0:  # a single enormous run: keep its allowed prefix
                return text[: match.start() + max_tokens * _STANDARD_MAX_TOKEN_LENGTH]
            return text[: match.start()]
        used += cost
    return text


def redact_url(url: str) -> str:
    """`url` without a password, for error messages."""
    parts = urlsplit(url)
    if parts.password is None:
        return url
    netloc = f"{parts.username}:***@{parts.hostname}" + (f":{parts.port}" if parts.port else "")
    return urlunsplit(parts._replace(netloc=netloc))


def check_index_name(index: str) -> None:
    if (
        not index
        or index in {".", ".."}
        or index[0] in "-_+"
        or _INDEX_NAME_FORBIDDEN.search(index)
        or len(index.encode()) > 255
    ):
        raise ConfigurationError(
            f"invalid OpenSearch index name {index!r}: use lowercase letters, digits, '-', '_' or '.',"
            " not starting with '-', '_' or '+', at most 255 bytes"
        )


def _error_type(err: os_exc.TransportError) -> str:
    info = err.info if isinstance(err.info, dict) else {}
    error = info.get("error")
    if isinstance(error, dict):
        return str(error.get("type", ""))
    return str(err.error or "")


@contextmanager
def translate_errors(
    url: str,
    timeout_s: float,
    index: str,
    not_found: Callable[[], IndexNotFoundError],
    passthrough: tuple[type[Exception], ...] = (),
) -> Iterator[None]:
    """Translate opensearch-py exceptions into the library's precise errors (`not_found()` for a
    missing index); `url` is shown without its password."""
    url = redact_url(url)
    try:
        yield
    except passthrough:
        raise
    except os_exc.ConnectionTimeout as err:
        raise RetrieverUnavailableError(
            f"OpenSearch at {url} did not answer within {timeout_s:g} s ({err.error})"
        ) from err
    except os_exc.ConnectionError as err:
        raise RetrieverUnavailableError(
            f"OpenSearch at {url} is unreachable ({err.error}); is it running? "
            "A local node starts with `python -m infra.local opensearch --port PORT`"
        ) from err
    except os_exc.NotFoundError as err:
        if _error_type(err) == "index_not_found_exception":
            raise not_found() from err
        raise RetrieverUnavailableError(
            f"OpenSearch at {url} answered 404 ({_error_type(err)}): is it an OpenSearch REST endpoint?"
        ) from err
    except (os_exc.AuthenticationException, os_exc.AuthorizationException) as err:
        raise RetrieverUnavailableError(
            f"OpenSearch at {url} refused the request ({err.status_code} {_error_type(err)}): check the credentials in OPENSEARCH_URL"
        ) from err
    except os_exc.TransportError as err:
        status = err.status_code if isinstance(err.status_code, int) else 0
        if status == 429 or status >= 500:
            raise RetrieverUnavailableError(
                f"OpenSearch at {url} failed ({status} {_error_type(err)}) on index '{index}'"
            ) from err
        raise


def make_client(url: str, timeout_s: float, maxsize: int = 16) -> OpenSearch:
    """The client a retriever uses: a pool of `maxsize` connections, one retry on a dropped
    connection (a refused port fails fast either way)."""
    return OpenSearch(
        hosts=[url], timeout=timeout_s, pool_maxsize=maxsize, max_retries=1, retry_on_timeout=False,
    )


class _QueryRejected(Exception):
    """The cluster refused the query itself (as opposed to being unavailable)."""


def _query_rejected(err: os_exc.TransportError) -> bool:
    """A 400 on a search, or the clause limit, which Lucene reports as a 500 when it trips while
    the query runs (`TooManyNestedClauses`) rather than while it is built (`too_many_clauses`)."""
    if err.status_code == 400 and _error_type(err) != "index_not_found_exception":
        return True
    detail = str(err.info)
    return "too_many_clauses" in detail or "maxClauseCount" in detail or "TooManyNestedClauses" in detail


class OpenSearchRetriever:
    """BM25 over one OpenSearch index or alias: `build` fills it, `upsert`/`delete` maintain it,
    `search` queries it.

    One `OpenSearch` client (a urllib3 pool of `maxsize` connections) per retriever unless
    `client` shares one (many tenants' retrievers over one pool; `close` leaves it open). The
    retriever is thread-safe and meant to be shared by a worker's threads. `not_found_message`
    replaces the default `IndexNotFoundError` text (a tenant's knowledge base names the tenant).
    """

    def __init__(
        self,
        url: str,
        index: str,
        *,
        title_boost: float = 2.0,
        timeout_s: float = 10.0,
        maxsize: int = 16,
        max_query_tokens: int = MAX_QUERY_TOKENS,
        number_of_shards: int = 1,
        number_of_replicas: int = 0,
        client: OpenSearch | None = None,
        not_found_message: str | None = None,
    ) -> None:
        check_index_name(index)
        if not url:
            raise ConfigurationError("OpenSearchRetriever needs a URL such as http://127.0.0.1:9200")
        self.url = url
        self.index = index
        self.title_boost = float(title_boost)
        self.timeout_s = float(timeout_s)
        self.max_query_tokens = max_query_tokens
        self.number_of_shards = number_of_shards
        self.number_of_replicas = number_of_replicas
        self.not_found_message = not_found_message
        self._owns_client = client is None
        self._client = client if client is not None else make_client(url, self.timeout_s, maxsize)

    # ---- construction ----------------------------------------------------------------------

    @classmethod
    def create(
        cls,
        url: str,
        index: str,
        passages: Iterable[Passage],
        on_progress: Callable[[int], None] | None = None,
        **kwargs: Any,
    ) -> OpenSearchRetriever:
        """(Re)create `index` at `url` from `passages`, like `TantivyRetriever.build`.

        `kwargs` go to the constructor (`title_boost`, `timeout_s`, ...).
        """
        retriever = cls(url, index, **kwargs)
        retriever.build(passages, on_progress)
        return retriever

    def index_body(self) -> dict[str, Any]:
        """Settings and explicit mappings of the index."""
        return {
            "settings": {
                "index": {
                    "number_of_shards": self.number_of_shards,
                    "number_of_replicas": self.number_of_replicas,
                    "similarity": {"default": {"type": "BM25", "k1": 1.2, "b": 0.75}},
                },
            },
            "mappings": {
                "dynamic": "strict",
                "properties": self.field_mappings(),
            },
        }

    @staticmethod
    def field_mappings() -> dict[str, Any]:
        return {
            "id": {"type": "keyword"},
            "doc_id": {"type": "keyword"},
            "title": {"type": "text", "analyzer": "english"},
            "section": {"type": "text", "analyzer": "english"},
            "text": {"type": "text", "analyzer": "english"},
        }

    def build(
        self,
        passages: Iterable[Passage],
        on_progress: Callable[[int], None] | None = None,
        recreate: bool = True,
        *,
        chunk_size: int = 500,
        max_retries: int = 5,
    ) -> int:
        """Index `passages` (bulk, `_id` = passage id) and refresh; return how many were indexed.

        `recreate` drops and recreates the index first; otherwise the index is created if
        missing and passages with an existing id are replaced. `on_progress(n)` is called with
        the number of passages just indexed (an increment, like the tantivy build's), once per
        bulk chunk. Items the cluster rejects with 429 are retried with backoff (`max_retries`).
        """
        with self._errors():
            indices = self._client.indices
            if recreate and indices.exists(index=self.index):
                indices.delete(index=self.index)
            if not indices.exists(index=self.index):
                body = self.index_body()
                body["settings"]["index"]["refresh_interval"] = "-1"
                indices.create(index=self.index, body=body)
            else:
                # an index made before doc_id/section: adding fields to a mapping is allowed
                indices.put_mapping(index=self.index, body={"properties": self.field_mappings()})
                indices.put_settings(index=self.index, body={"index": {"refresh_interval": "-1"}})

            indexed = 0
            pending = 0
            failures: list[Any] = []
            try:
                for ok, item in self._bulk(
                    self._actions(passages), chunk_size=chunk_size, max_retries=max_retries
                ):
                    if ok:
                        indexed += 1
                        pending += 1
                        if on_progress and pending >= chunk_size:
                            on_progress(pending)
                            pending = 0
                    else:
                        failures.append(item)
                if on_progress and pending:
                    on_progress(pending)
            finally:
                indices.put_settings(index=self.index, body={"index": {"refresh_interval": None}})
                indices.refresh(index=self.index)
        self._raise_failures(failures, "indexed into")
        return indexed

    def upsert(
        self,
        passages: Iterable[Passage],
        *,
        require_alias: bool = False,
        chunk_size: int = 500,
        max_retries: int = 5,
    ) -> int:
        """Add or replace `passages` by id; visible to searches when the call returns.

        Bulk with `refresh=wait_for` (each request returns after the refresh that makes it
        visible, without forcing one). `require_alias`: `index` must be an alias (else the
        cluster refuses each item rather than auto-creating an index with guessed mappings);
        without it the index must exist. Returns how many passages were written.
        """
        batch = list(passages)
        for p in batch:
            if not p.id:
                raise ValueError(f"a passage needs an id to be upserted: {p!r}")
        if not batch:
            return 0
        written = 0
        failures: list[Any] = []
        with self._errors():
            if not require_alias and not self._client.indices.exists(index=self.index):
                raise self._not_found()
            for ok, item in self._bulk(
                self._actions(batch), chunk_size=chunk_size, max_retries=max_retries,
                refresh="wait_for", require_alias=require_alias,
            ):
                if ok:
                    written += 1
                else:
                    failures.append(item)
        self._raise_failures(failures, "upserted into")
        return written

    def delete(
        self, ids: Iterable[str], *, require_alias: bool = False, chunk_size: int = 500,
        max_retries: int = 5,
    ) -> int:
        """Remove the passages with these ids (unknown ids are ignored), visible on return;
        returns how many existed."""
        batch = [i for i in dict.fromkeys(ids) if i]
        if not batch:
            return 0
        deleted = 0
        failures: list[Any] = []
        actions = ({"_op_type": "delete", "_index": self.index, "_id": i} for i in batch)
        with self._errors():
            if not require_alias and not self._client.indices.exists(index=self.index):
                raise self._not_found()
            for ok, item in self._bulk(
                actions, chunk_size=chunk_size, max_retries=max_retries,
                refresh="wait_for", require_alias=require_alias,
            ):
                result = next(iter(item.values()), {})
                if ok:
                    deleted += 1
                elif result.get("status") == 404 and "error" not in result:
                    continue  # an unknown id ("result": "not_found")
                else:
                    failures.append(item)
        self._raise_failures(failures, "deleted from")
        return deleted

    def _bulk(
        self, actions: Iterable[dict[str, Any]], *, chunk_size: int, max_retries: int,
        **params: Any,
    ) -> Iterator[tuple[bool, Any]]:
        """`streaming_bulk` with per-item results; items refused with 429 retried with backoff."""
        return streaming_bulk(
            self._client,
            actions,
            chunk_size=chunk_size,
            max_chunk_bytes=16 * 1024 * 1024,
            raise_on_error=False,
            max_retries=max_retries,
            initial_backoff=1,
            max_backoff=30,
            request_timeout=max(60.0, self.timeout_s),
            **params,
        )

    def _raise_failures(self, failures: list[Any], verb: str) -> None:
        if not failures:
            return
        statuses = [next(iter(f.values()), {}).get("status", 0) for f in failures]
        message = (
            f"{len(failures)} passages could not be {verb} OpenSearch index '{self.index}' at "
            f"{redact_url(self.url)}; first failure: {failures[0]}"
        )
        if any(s == 429 or s >= 500 for s in statuses):
            raise RetrieverUnavailableError(message)
        if all(s == 404 for s in statuses):
            raise self._not_found()
        raise AdaptiveRagError(message)

    def _actions(self, passages: Iterable[Passage]) -> Iterator[dict[str, Any]]:
        for p in passages:
            yield {
                "_op_type": "index",
                "_index": self.index,
                "_id": p.id,
                "_source": {
                    "id": p.id, "doc_id": p.doc_id, "title": p.title,
                    "section": p.section, "text": p.text,
                },
            }

    def delete_index(self) -> None:
        """Drop the index if it exists."""
        with self._errors():
            self._client.indices.delete(index=self.index, ignore_unavailable=True)

    # ---- queries ------------------------------------------------------------------------------

    def count(self) -> int:
        """Number of passages in the index."""
        with self._errors():
            return int(self._client.count(index=self.index)["count"])

    def query_body(self, text: str, k: int) -> dict[str, Any]:
        """The search request for already bounded query `text`."""
        return {
            "size": k,
            "track_total_hits": False,
            "_source": _SOURCE_FIELDS,
            "query": {
                "multi_match": {
                    "query": text,
                    "type": "most_fields",
                    "fields": [f"title^{self.title_boost:g}", f"section^{self.title_boost:g}", "text"],
                    "operator": "or",
                    "zero_terms_query": "none",
                    "lenient": True,
                }
            },
        }

    def search(self, query: str, k: int) -> list[Passage]:
        """At most `k` passages for the raw user text `query`, best first (never a syntax error)."""
        if not isinstance(query, str) or not query.strip() or k <= 0:
            return []
        k = min(int(k), _MAX_RESULT_WINDOW)
        text = bound_query(query, self.max_query_tokens)
        if not text.strip():
            return []
        try:
            hits = self._search(text, k)
        except _QueryRejected as err:
            # Most likely a lower clause limit than assumed: retry once, much shorter.
            log.warning("OpenSearch rejected a query (%s); retrying shorter", err)
            shorter = bound_query(query, min(64, max(1, self.max_query_tokens // 4)))
            try:
                hits = self._search(shorter, k)
            except _QueryRejected as err2:
                log.warning("OpenSearch rejected the shortened query too (%s): no results", err2)
                return []
        passages = []
        for hit in hits:
            src = hit.get("_source") or {}
            passages.append(
                Passage(
                    id=str(src.get("id", hit.get("_id"))),
                    title=src.get("title") or "",
                    text=src.get("text") or "",
                    score=float(hit.get("_score") or 0.0),
                    doc_id=src.get("doc_id") or "",
                    section=src.get("section") or "",
                )
            )
        return passages

    def query_weight(self, query: str) -> float:
        """The summed BM25 idf of `query`'s distinct terms (`ports.QueryWeigher`), from the
        index's term statistics (one term-vectors request for the query as an artificial
        document, analysed like the searched fields); a term's document frequency is its largest
        in any searched field. Exact with one shard, the default."""
        from adaptive_rag.retrieval.relevance import bm25_idf

        if not isinstance(query, str) or not query.strip():
            return 0.0
        text = bound_query(query, self.max_query_tokens)
        fields = ["title", "section", "text"]
        body = {"doc": dict.fromkeys(fields, text), "fields": fields, "term_statistics": True,
                "field_statistics": True, "positions": False, "offsets": False, "payloads": False}
        with self._errors():
            response = self._client.termvectors(index=self.index, body=body)
        vectors = response.get("term_vectors") or {}
        docs = max((v.get("field_statistics", {}).get("doc_count", 0) for v in vectors.values()), default=0)
        frequencies: dict[str, int] = {}
        for vector in vectors.values():
            for term, stats in (vector.get("terms") or {}).items():
                frequencies[term] = max(frequencies.get(term, 0), int(stats.get("doc_freq", 0)))
        return sum(bm25_idf(df, docs) for df in frequencies.values())

    def _search(self, text: str, k: int) -> list[dict[str, Any]]:
        with self._errors(passthrough=(_QueryRejected,)):
            try:
                response = self._client.search(
                    index=self.index,
                    body=self.query_body(text, k),
                    params={"filter_path": "hits.hits._id,hits.hits._score,hits.hits._source"},
                )
            except os_exc.TransportError as err:
                if _query_rejected(err):
                    raise _QueryRejected(_error_type(err)) from err
                raise
        # filter_path drops `hits` altogether when nothing matched
        return response.get("hits", {}).get("hits", [])

    # ---- plumbing -----------------------------------------------------------------------------

    @contextmanager
    def _errors(self, passthrough: tuple[type[Exception], ...] = ()) -> Iterator[None]:
        with translate_errors(
            self.url, self.timeout_s, self.index, self._not_found, passthrough=passthrough
        ):
            yield

    def _not_found(self) -> IndexNotFoundError:
        return IndexNotFoundError(
            self.not_found_message
            or f"OpenSearch index '{self.index}' does not exist at {redact_url(self.url)}; {_BUILD_HINT}"
        )

    def close(self) -> None:
        """Release the connection pool (unless it is a shared client)."""
        if self._owns_client:
            self._client.close()

    def __enter__(self) -> OpenSearchRetriever:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"OpenSearchRetriever(url={redact_url(self.url)!r}, index={self.index!r})"
