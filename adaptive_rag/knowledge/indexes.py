"""`KnowledgeIndex` adapters: one BM25 index per tenant, kept current without downtime.

Embedded (`TantivyKnowledgeIndex`): `<root>/<slug>/gen-000001/` ... tantivy directories and a
`CURRENT` file naming the live one, replaced atomically. `upsert`/`delete` commit into the live
generation; `rebuild` writes the next generation beside it, swaps the pointer, then removes the
old directories (searchers that still hold them keep reading: on Linux an unlinked, mmapped file
stays readable). Writers take a per-tenant `flock`, so an import in another process makes a
write fail with `KnowledgeBaseBusyError` rather than interleave with it.

OpenSearch (`OpenSearchKnowledgeIndex`): index `<prefix>-<slug>-g<N>` behind the alias
`<prefix>-<slug>`. Searches go through the alias; `rebuild` fills `g<N+1>`, then moves the alias in
one atomic `update_aliases`, then drops the old index after a grace period for searches already
running on it.

The backends' libraries (tantivy, opensearch-py) are imported when a backend is used: they belong
to the worker install, and importing `tenant_slug` must not need them.
"""

from __future__ import annotations

import fcntl
import hashlib
import logging
import os
import re
import shutil
import threading
import time
import unicodedata
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

from adaptive_rag.domain import Passage
from adaptive_rag.errors import ConfigurationError, IndexNotFoundError, KnowledgeBaseBusyError
from adaptive_rag.knowledge.documents import KnowledgeIndex
from adaptive_rag.settings import Settings

if TYPE_CHECKING:
    from adaptive_rag.retrieval.opensearch import OpenSearchRetriever
    from adaptive_rag.retrieval.tantivy_index import TantivyRetriever

log = logging.getLogger(__name__)

# Readable part of a slug; the hash makes it unique.
_SLUG_READABLE_CHARS = 40
_SLUG_HASH_CHARS = 16  # 64 bits of sha256: collisions need equal readable parts as well
_NON_SLUG = re.compile(r"[^a-z0-9]+")


def tenant_slug(tenant: str) -> str:
    """A name for `tenant` that is safe as a directory and inside an OpenSearch index name.

    Lowercase `[a-z0-9-]`, at most 57 characters: the tenant folded to ASCII (for people reading
    a listing) plus 16 hex digits of the SHA-256 of the exact string, so tenants that differ only
    in case, accents or punctuation ("Acme", "acme", "ACME!") still get different names.
    Deterministic across processes and versions: stored data is found by it.
    """
    if not isinstance(tenant, str) or not tenant:
        raise ValueError(f"a tenant must be a non-empty string, not {tenant!r}")
    digest = hashlib.sha256(tenant.encode("utf-8", "surrogatepass")).hexdigest()[:_SLUG_HASH_CHARS]
    folded = unicodedata.normalize("NFKD", tenant).encode("ascii", "ignore").decode("ascii")
    readable = _NON_SLUG.sub("-", folded.lower()).strip("-")[:_SLUG_READABLE_CHARS].strip("-")
    return f"{readable}-{digest}" if readable else digest


def _checked(chunks: Iterable[Passage]) -> list[Passage]:
    batch = list(chunks)
    for chunk in batch:
        if not isinstance(chunk, Passage) or not chunk.id:
            raise ValueError(f"a chunk must be a Passage with an id, not {chunk!r}")
    return batch


# ---- embedded tantivy ------------------------------------------------------------------------

POINTER_FILE = "CURRENT"
TENANT_FILE = "TENANT"
LOCK_FILE = ".writer.lock"
_GENERATION = re.compile(r"^gen-(\d{6,})$")
_OPEN_ATTEMPTS = 5


def generation_name(generation: int) -> str:
    return f"gen-{generation:06d}"


def _read_pointer(tenant_dir: Path) -> int | None:
    try:
        text = (tenant_dir / POINTER_FILE).read_text(encoding="ascii").strip()
    except FileNotFoundError:
        return None
    match = _GENERATION.match(text)
    if not match:
        raise IndexNotFoundError(f"{tenant_dir / POINTER_FILE} is corrupt: {text[:40]!r}")
    return int(match.group(1))


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _write_atomically(path: Path, text: str) -> None:
    """Replace `path` by `text` so a reader sees the old or the new content, never a mix."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{threading.get_ident()}.tmp")
    with open(tmp, "w", encoding="utf-8") as handle:
        handle.write(text)
        handle.flush()
        os.fsync(handle.fileno())
    os.replace(tmp, path)
    _fsync_dir(path.parent)


class TantivyTenantRetriever:
    """BM25 over a tenant's live tantivy generation.

    Each search `stat`s `CURRENT` (a few microseconds) and reopens only when it was replaced;
    the generation's own `TantivyRetriever` then reloads only when `meta.json` changed. So a
    search pays two `stat`s, and a reopen (~0.3 ms) or a reload (tens of µs) only after a
    rebuild or a commit. Thread-safe.
    """

    def __init__(self, tenant: str, tenant_dir: Path, *, title_boost: float = 1.0) -> None:
        from adaptive_rag.retrieval.tantivy_index import TantivyRetriever, file_stamp

        self._open_generation = TantivyRetriever
        self._stamp = file_stamp
        self.tenant = tenant
        self.tenant_dir = tenant_dir
        self.title_boost = title_boost
        self._pointer = tenant_dir / POINTER_FILE
        self._lock = threading.Lock()
        self._pointer_stamp: tuple[int, int, int, int] | None = None
        self._generation = 0
        self._current: TantivyRetriever | None = None
        self._reopen()

    @property
    def generation(self) -> int:
        """The generation searches currently answer from."""
        self._live()
        return self._generation

    def _not_found(self) -> IndexNotFoundError:
        return IndexNotFoundError(
            f"tenant {self.tenant!r} has no knowledge base (no index in {self.tenant_dir}); "
            "import documents first"
        )

    def _reopen(self) -> None:
        """Open the generation `CURRENT` names; retried when a rebuild swaps it meanwhile."""
        for _ in range(_OPEN_ATTEMPTS):
            stamp = self._stamp(self._pointer)  # before reading: a swap in between reopens again
            generation = _read_pointer(self.tenant_dir)
            if generation is None:
                if self._current is not None:
                    return  # the pointer was removed: keep answering from what is open
                raise self._not_found()
            if generation == self._generation and self._current is not None:
                self._pointer_stamp = stamp
                return
            try:
                retriever = self._open_generation(
                    self.tenant_dir / generation_name(generation), title_boost=self.title_boost
                )
            except IndexNotFoundError:
                continue  # removed by a newer rebuild between reading the pointer and opening
            self._current, self._generation, self._pointer_stamp = retriever, generation, stamp
            return
        if self._current is None:
            raise self._not_found()

    def _live(self) -> TantivyRetriever:
        stamp = self._stamp(self._pointer)
        if stamp != self._pointer_stamp or self._current is None:
            with self._lock:
                if stamp != self._pointer_stamp or self._current is None:
                    self._reopen()
        assert self._current is not None
        return self._current

    def search(self, query: str, k: int) -> list[Passage]:
        return self._live().search(query, k)

    def query_weight(self, query: str) -> float:
        return self._live().query_weight(query)

    def count(self) -> int:
        return self._live().count()

    def __repr__(self) -> str:
        return f"TantivyTenantRetriever(tenant={self.tenant!r}, dir={str(self.tenant_dir)!r})"


class TantivyKnowledgeIndex:
    """`KnowledgeIndex` over embedded tantivy directories under `root`, one per tenant.

    Several instances and processes may share `root`: writes of one tenant are serialised by a
    lock file; a write that cannot get it within `busy_timeout_s` raises `KnowledgeBaseBusyError`.
    """

    def __init__(self, root: Path, *, title_boost: float = 1.0, busy_timeout_s: float = 2.0) -> None:
        self.root = Path(root)
        self.title_boost = title_boost
        self.busy_timeout_s = busy_timeout_s
        self._locks: dict[str, threading.Lock] = {}
        self._locks_guard = threading.Lock()

    def tenant_dir(self, tenant: str) -> Path:
        return self.root / tenant_slug(tenant)

    def generation(self, tenant: str) -> int | None:
        """The live generation of `tenant`'s index, None when it has none."""
        return _read_pointer(self.tenant_dir(tenant))

    # ---- writes -------------------------------------------------------------------------------

    def upsert(self, tenant: str, chunks: Sequence[Passage]) -> None:
        from adaptive_rag.retrieval.tantivy_index import TantivyRetriever

        batch = _checked(chunks)
        with self._writing(tenant) as tenant_dir:
            generation = _read_pointer(tenant_dir)
            if generation is None:
                generation = 1
                TantivyRetriever.build(tenant_dir / generation_name(1), [])
                _write_atomically(tenant_dir / POINTER_FILE, generation_name(1) + "\n")
            TantivyRetriever(tenant_dir / generation_name(generation)).upsert(batch)

    def delete(self, tenant: str, chunk_ids: Iterable[str]) -> None:
        from adaptive_rag.retrieval.tantivy_index import TantivyRetriever

        ids = list(chunk_ids)
        if not ids or _read_pointer(self.tenant_dir(tenant)) is None:
            return
        with self._writing(tenant) as tenant_dir:
            generation = _read_pointer(tenant_dir)
            if generation is not None:
                TantivyRetriever(tenant_dir / generation_name(generation)).delete(ids)

    def rebuild(self, tenant: str, chunks: Iterable[Passage]) -> int:
        from adaptive_rag.retrieval.tantivy_index import TantivyRetriever

        with self._writing(tenant) as tenant_dir:
            generation = (_read_pointer(tenant_dir) or 0) + 1
            target = tenant_dir / generation_name(generation)
            try:
                # `build` clears a directory a crashed rebuild may have left at this number
                TantivyRetriever.build(target, _validated(chunks), title_boost=self.title_boost)
                _write_atomically(tenant_dir / POINTER_FILE, generation_name(generation) + "\n")
            except BaseException:
                shutil.rmtree(target, ignore_errors=True)
                raise
            for old in tenant_dir.iterdir():
                if old.is_dir() and _GENERATION.match(old.name) and old != target:
                    shutil.rmtree(old, ignore_errors=True)
            return generation

    @contextmanager
    def _writing(self, tenant: str) -> Iterator[Path]:
        """Hold `tenant`'s writer lock: a thread lock here, an `flock` across processes."""
        tenant_dir = self.tenant_dir(tenant)
        tenant_dir.mkdir(parents=True, exist_ok=True)
        if not (tenant_dir / TENANT_FILE).exists():  # which tenant a slug is, for operators
            _write_atomically(tenant_dir / TENANT_FILE, tenant)
        with self._locks_guard:
            thread_lock = self._locks.setdefault(tenant_dir.name, threading.Lock())
        busy = KnowledgeBaseBusyError(
            f"the knowledge base of tenant {tenant!r} is being written by another import or "
            f"rebuild (lock {tenant_dir / LOCK_FILE}); retry when it has finished"
        )
        deadline = time.monotonic() + self.busy_timeout_s
        if not thread_lock.acquire(timeout=max(0.0, self.busy_timeout_s)):
            raise busy
        try:
            with open(tenant_dir / LOCK_FILE, "a+b") as lock_file:
                while True:
                    try:
                        fcntl.flock(lock_file.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
                        break
                    except BlockingIOError:
                        if time.monotonic() >= deadline:
                            raise busy from None
                        time.sleep(0.02)
                try:
                    yield tenant_dir
                finally:
                    fcntl.flock(lock_file.fileno(), fcntl.LOCK_UN)
        finally:
            thread_lock.release()

    # ---- reads --------------------------------------------------------------------------------

    def exists(self, tenant: str) -> bool:
        tenant_dir = self.tenant_dir(tenant)
        generation = _read_pointer(tenant_dir)
        return generation is not None and (tenant_dir / generation_name(generation) / "meta.json").exists()

    def count(self, tenant: str) -> int:
        try:
            return self.retriever(tenant).count()
        except IndexNotFoundError:
            return 0

    def retriever(self, tenant: str) -> TantivyTenantRetriever:
        return TantivyTenantRetriever(tenant, self.tenant_dir(tenant), title_boost=self.title_boost)

    def __repr__(self) -> str:
        return f"TantivyKnowledgeIndex({str(self.root)!r})"


def _validated(chunks: Iterable[Passage]) -> Iterator[Passage]:
    """`chunks`, streamed (a rebuild may be large), each checked like `_checked` does."""
    for chunk in chunks:
        if not isinstance(chunk, Passage) or not chunk.id:
            raise ValueError(f"a chunk must be a Passage with an id, not {chunk!r}")
        yield chunk


# ---- OpenSearch ----------------------------------------------------------------------------------


class OpenSearchKnowledgeIndex:
    """`KnowledgeIndex` over OpenSearch: `<prefix>-<slug>-g<N>` behind the alias `<prefix>-<slug>`.

    One client (connection pool) shared by every retriever it hands out; `close` closes it.
    Writers of one tenant are not serialised across processes here: an upsert that runs while a
    rebuild of the same tenant is filling the next generation lands in the old one and is gone
    after the swap, so callers serialise a tenant's writes (the knowledge-base service does).
    Two rebuilds at once: the loser fails with `KnowledgeBaseBusyError` (its index name is taken,
    or its swap finds the alias already moved: the removal carries `must_exist`) and the alias
    keeps exactly one index.
    """

    def __init__(
        self,
        url: str,
        prefix: str = "arag-kb",
        *,
        title_boost: float = 1.0,
        timeout_s: float = 10.0,
        maxsize: int = 16,
        number_of_shards: int = 1,
        number_of_replicas: int = 0,
        chunk_size: int = 500,
        max_retries: int = 5,
        old_index_grace_s: float = 1.0,
    ) -> None:
        from adaptive_rag.retrieval.opensearch import check_index_name, make_client

        if not url:
            raise ConfigurationError("OpenSearchKnowledgeIndex needs a URL such as http://127.0.0.1:9200")
        check_index_name(f"{prefix}-0")
        self.url = url
        self.prefix = prefix
        self.title_boost = float(title_boost)
        self.timeout_s = float(timeout_s)
        self.number_of_shards = number_of_shards
        self.number_of_replicas = number_of_replicas
        self.chunk_size = chunk_size
        self.max_retries = max_retries
        # Searches that resolved the alias just before a swap may still run on the old index.
        self.old_index_grace_s = old_index_grace_s
        self._client = make_client(url, self.timeout_s, maxsize)

    # ---- names --------------------------------------------------------------------------------

    def alias(self, tenant: str) -> str:
        return f"{self.prefix}-{tenant_slug(tenant)}"

    def index_name(self, tenant: str, generation: int) -> str:
        return f"{self.alias(tenant)}-g{generation}"

    def _retriever(self, tenant: str, index: str | None = None) -> OpenSearchRetriever:
        from adaptive_rag.retrieval.opensearch import OpenSearchRetriever

        return OpenSearchRetriever(
            self.url, index or self.alias(tenant), title_boost=self.title_boost,
            timeout_s=self.timeout_s, number_of_shards=self.number_of_shards,
            number_of_replicas=self.number_of_replicas, client=self._client,
            not_found_message=str(self._not_found(tenant)),
        )

    def _not_found(self, tenant: str) -> IndexNotFoundError:
        return IndexNotFoundError(
            f"tenant {tenant!r} has no knowledge base in OpenSearch at {self._safe_url()} "
            f"(no alias '{self.alias(tenant)}'); import documents first"
        )

    def _safe_url(self) -> str:
        from adaptive_rag.retrieval.opensearch import redact_url

        return redact_url(self.url)

    @contextmanager
    def _errors(self, tenant: str) -> Iterator[None]:
        from adaptive_rag.retrieval.opensearch import translate_errors

        with translate_errors(
            self.url, self.timeout_s, self.alias(tenant), lambda: self._not_found(tenant)
        ):
            yield

    def _holders(self, tenant: str) -> list[str]:
        """Indices the tenant's alias points to: one, or none for a tenant without an index."""
        with self._errors(tenant):
            # a missing alias is an expected answer here, not a failure to log
            found = self._client.indices.get_alias(name=self.alias(tenant), params={"ignore": 404})
        if found.get("status") == 404 and "error" in found:
            return []
        return sorted(found)

    def _generations(self, tenant: str) -> dict[int, str]:
        """Every generation index of the tenant, live or not, by number (exact names only: a
        wildcard could also match another tenant whose slug extends this one)."""
        alias = self.alias(tenant)
        pattern = re.compile(rf"^{re.escape(alias)}-g(\d+)$")
        with self._errors(tenant):
            names = self._client.indices.get(
                index=f"{alias}-g*", params={"allow_no_indices": "true", "expand_wildcards": "all",
                                            "filter_path": "*.settings.index.uuid"},
            )
        found = {}
        for name in names or {}:
            match = pattern.match(name)
            if match:
                found[int(match.group(1))] = name
        return found

    def generation(self, tenant: str) -> int | None:
        """The live generation of `tenant`'s index, None when it has none."""
        alias = self.alias(tenant)
        numbers = [int(h.rsplit("-g", 1)[1]) for h in self._holders(tenant) if h.startswith(alias + "-g")]
        return max(numbers) if numbers else None

    # ---- writes -------------------------------------------------------------------------------

    def upsert(self, tenant: str, chunks: Sequence[Passage]) -> None:
        batch = _checked(chunks)
        self._ensure(tenant)
        self._retriever(tenant).upsert(
            batch, require_alias=True, chunk_size=self.chunk_size, max_retries=self.max_retries
        )

    def _ensure(self, tenant: str) -> None:
        """Create generation 1 with the alias when the tenant has no index yet (one request:
        the index is born behind its alias)."""
        from opensearchpy import exceptions as os_exc

        if self._holders(tenant):
            return
        generation = max(self._generations(tenant), default=0) + 1
        body = self._retriever(tenant, self.index_name(tenant, generation)).index_body()
        body["aliases"] = {self.alias(tenant): {}}
        with self._errors(tenant):
            try:
                self._client.indices.create(index=self.index_name(tenant, generation), body=body)
            except os_exc.RequestError as err:
                # another writer created it first; fine as long as the alias now exists
                if "resource_already_exists_exception" not in str(err.error) + str(err.info):
                    raise
        if not self._holders(tenant):
            raise KnowledgeBaseBusyError(
                f"the knowledge base of tenant {tenant!r} is being created by another writer; retry"
            )

    def delete(self, tenant: str, chunk_ids: Iterable[str]) -> None:
        ids = list(chunk_ids)
        if not ids or not self._holders(tenant):
            return
        try:
            self._retriever(tenant).delete(
                ids, require_alias=True, chunk_size=self.chunk_size, max_retries=self.max_retries
            )
        except IndexNotFoundError:
            return  # removed meanwhile: nothing left to delete from

    def rebuild(self, tenant: str, chunks: Iterable[Passage]) -> int:
        from opensearchpy import exceptions as os_exc

        alias = self.alias(tenant)
        # A new tenant gets an empty g1 first, so the swap below always removes a holder with
        # `must_exist`: two racing rebuilds cannot both add their index to the alias.
        self._ensure(tenant)
        holders = self._holders(tenant)
        generation = max(self._generations(tenant), default=0) + 1
        target = self.index_name(tenant, generation)
        builder = self._retriever(tenant, target)
        body = builder.index_body()
        body["settings"]["index"]["refresh_interval"] = "-1"
        with self._errors(tenant):
            try:
                self._client.indices.create(index=target, body=body)
            except os_exc.RequestError as err:
                if "resource_already_exists_exception" in str(err.error) + str(err.info):
                    raise KnowledgeBaseBusyError(
                        f"another rebuild of tenant {tenant!r}'s knowledge base is running "
                        f"(index '{target}' exists); retry when it has finished"
                    ) from err
                raise
        try:
            # fills, restores the refresh interval and refreshes: searchable before the swap
            builder.build(_validated(chunks), recreate=False, chunk_size=self.chunk_size,
                          max_retries=self.max_retries)
            actions: list[dict[str, Any]] = [
                {"remove": {"index": h, "alias": alias, "must_exist": True}} for h in holders
            ]
            actions.append({"add": {"index": target, "alias": alias}})
            with self._errors(tenant):
                try:
                    self._client.indices.update_aliases(body={"actions": actions})
                except os_exc.NotFoundError as err:
                    # `must_exist` failed, or the old index is gone: nothing was applied
                    raise KnowledgeBaseBusyError(
                        f"tenant {tenant!r}'s knowledge base changed during the rebuild (another "
                        "rebuild swapped it first); this rebuild was discarded, retry"
                    ) from err
        except BaseException:
            self._drop(tenant, [target])
            raise
        # older generations: the one just replaced and any a crashed rebuild left behind
        stale = [name for number, name in self._generations(tenant).items() if number < generation]
        if stale:
            if self.old_index_grace_s > 0:
                time.sleep(self.old_index_grace_s)
            self._drop(tenant, stale)
        return generation

    def _drop(self, tenant: str, indices: list[str]) -> None:
        for name in indices:
            try:
                with self._errors(tenant):
                    self._client.indices.delete(index=name, ignore_unavailable=True)
            except Exception as err:  # the swap already happened; a leftover is cleaned later
                log.warning("could not delete OpenSearch index %s: %s", name, err)

    # ---- reads --------------------------------------------------------------------------------

    def exists(self, tenant: str) -> bool:
        return bool(self._holders(tenant))

    def count(self, tenant: str) -> int:
        try:
            return self._retriever(tenant).count()
        except IndexNotFoundError:
            return 0

    def retriever(self, tenant: str) -> OpenSearchRetriever:
        """`OpenSearchRetriever` on the tenant's alias (it follows swaps by construction)."""
        if not self._holders(tenant):
            raise self._not_found(tenant)
        return self._retriever(tenant)

    def close(self) -> None:
        """Close the connection pool (retrievers handed out share it)."""
        self._client.close()

    def __repr__(self) -> str:
        return f"OpenSearchKnowledgeIndex(url={self._safe_url()!r}, prefix={self.prefix!r})"


def open_knowledge_index(settings: Settings) -> KnowledgeIndex:
    """The configured backend: tantivy under `kb_dir`, or OpenSearch (needs `opensearch_url`)."""
    if settings.retriever == "opensearch":
        if not settings.opensearch_url:
            raise ConfigurationError("ARAG_RETRIEVER=opensearch needs OPENSEARCH_URL")
        return OpenSearchKnowledgeIndex(
            settings.opensearch_url, settings.kb_index_prefix,
            title_boost=settings.title_boost, timeout_s=settings.opensearch_timeout_s,
        )
    return TantivyKnowledgeIndex(settings.kb_dir, title_boost=settings.title_boost)
