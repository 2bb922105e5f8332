"""One contract for both `KnowledgeIndex` adapters (embedded tantivy, real OpenSearch): upserts,
deletes, tenant isolation, rebuilds without downtime, writers in other instances and processes.
"""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from adaptive_rag.domain import Passage
from adaptive_rag.errors import (
    ConfigurationError,
    IndexNotFoundError,
    KnowledgeBaseBusyError,
    RetrieverUnavailableError,
)
from adaptive_rag.knowledge.documents import KnowledgeIndex
from adaptive_rag.knowledge.indexes import (
    OpenSearchKnowledgeIndex,
    TantivyKnowledgeIndex,
    open_knowledge_index,
    tenant_slug,
)
from adaptive_rag.ports import Retriever
from adaptive_rag.settings import Settings
from infra.local.servers import free_port

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]
# A fresh instance over the same storage (same tantivy root / OpenSearch prefix) on each call.
Factory = Callable[..., KnowledgeIndex]


def chunk(doc: str, position: int, title: str, section: str, text: str) -> Passage:
    return Passage(f"{doc}#{position}", title, text, doc_id=doc, section=section)


RESET = chunk("kb-reset", 0, "Reset your password", "Forgotten password",
              "Click the forgotten password link on the sign-in page to get a reset email.")
INVOICE = chunk("kb-billing", 0, "Billing", "Invoices",
                "Invoices are emailed on the first day of every month as PDF attachments.")
REFUND = chunk("kb-billing", 1, "Billing", "Refunds",
               "Refunds reach the original card within ten working days.")


@pytest.fixture(params=["tantivy", "opensearch"])
def backend(request: pytest.FixtureRequest) -> str:
    return request.param


@pytest.fixture
def storage(backend: str, request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[dict[str, str]]:
    """Where one test's knowledge bases live: a tantivy root or an OpenSearch prefix."""
    if backend == "tantivy":
        yield {"backend": "tantivy", "root": str(tmp_path / "kb")}
        return
    url = request.getfixturevalue("opensearch_url")
    prefix = f"arag-kbtest-{uuid.uuid4().hex[:8]}"
    yield {"backend": "opensearch", "url": url, "prefix": prefix}
    from opensearchpy import OpenSearch

    client = OpenSearch(hosts=[url])
    _delete_indices(client, prefix)
    client.close()


def _delete_indices(client: object, prefix: str) -> None:
    """Drop a test's indexes by name (the cluster refuses wildcard deletes)."""
    names = list(client.indices.get(index=f"{prefix}-*", params={"expand_wildcards": "all"}))  # type: ignore[attr-defined]
    if names:
        client.indices.delete(index=",".join(names))  # type: ignore[attr-defined]


def make_index(storage: dict[str, str], **kwargs: float) -> KnowledgeIndex:
    if storage["backend"] == "tantivy":
        return TantivyKnowledgeIndex(Path(storage["root"]), **kwargs)
    kwargs.setdefault("old_index_grace_s", 0.2)
    return OpenSearchKnowledgeIndex(storage["url"], storage["prefix"], **kwargs)


@pytest.fixture
def factory(storage: dict[str, str]) -> Iterator[Factory]:
    made: list[KnowledgeIndex] = []

    def make(**kwargs: float) -> KnowledgeIndex:
        made.append(make_index(storage, **kwargs))
        return made[-1]

    yield make
    for index in made:
        if isinstance(index, OpenSearchKnowledgeIndex):
            index.close()


@pytest.fixture
def kb(factory: Factory) -> KnowledgeIndex:
    return factory()


def ids(passages: list[Passage]) -> list[str]:
    return [p.id for p in passages]


# ---- upsert, delete, count ----------------------------------------------------------------------


def test_upsert_then_search_finds_it_with_doc_id_and_section(kb: KnowledgeIndex) -> None:
    kb.upsert("acme", [RESET, INVOICE, REFUND])
    retriever = kb.retriever("acme")
    assert isinstance(retriever, Retriever)
    (top,) = retriever.search("how do I reset my password", 1)
    assert (top.id, top.doc_id, top.section, top.title, top.text) == (
        RESET.id, "kb-reset", "Forgotten password", RESET.title, RESET.text
    )
    assert top.score > 0
    # the section heading is searched too: "refunds" appears in REFUND's heading and text only
    assert ids(retriever.search("refunds", 3)) == [REFUND.id]


def test_a_tenants_retriever_weighs_queries_by_the_idf_of_their_terms(kb: KnowledgeIndex) -> None:
    """The weight relevance divides by (`retrieval.relevance`), through the tenant's alias too:
    "invoices" is in one chunk of three (text and heading), "refunds" in one, "zeppelin" in none."""
    from adaptive_rag.ports import QueryWeigher
    from adaptive_rag.retrieval.relevance import bm25_idf, relevance

    kb.upsert("acme", [RESET, INVOICE, REFUND])
    retriever = kb.retriever("acme")
    assert isinstance(retriever, QueryWeigher)
    expected = 2 * bm25_idf(1, 3) + bm25_idf(0, 3)
    assert retriever.query_weight("invoices refunds zeppelin") == pytest.approx(expected, rel=1e-3)
    assert retriever.query_weight("the and of") == 0.0 and retriever.query_weight("") == 0.0
    hits = retriever.search("when are invoices emailed", 3)
    assert 0 < relevance(retriever, "when are invoices emailed", hits) < 3


def test_section_heading_alone_matches(kb: KnowledgeIndex) -> None:
    only_in_heading = chunk("kb-sso", 0, "Single sign-on", "Okta", "Add the app in your provider.")
    kb.upsert("acme", [only_in_heading, INVOICE])
    assert ids(kb.retriever("acme").search("okta", 3)) == [only_in_heading.id]


def test_reupsert_replaces_without_duplicates(kb: KnowledgeIndex) -> None:
    kb.upsert("acme", [RESET, INVOICE])
    retriever = kb.retriever("acme")
    edited = Passage(RESET.id, RESET.title, "Use the magic link we email you.", doc_id="kb-reset",
                     section="Magic links")
    for _ in range(3):
        kb.upsert("acme", [edited])
    assert kb.count("acme") == 2
    hits = retriever.search("magic link email password", 10)
    assert ids(hits).count(RESET.id) == 1
    assert hits[0].text == edited.text and hits[0].section == "Magic links"
    assert retriever.search("sign-in page", 10) == []  # the old text is gone


def test_duplicate_ids_in_one_batch_keep_the_last(kb: KnowledgeIndex) -> None:
    first = Passage("kb-x#0", "X", "alpha version", doc_id="kb-x")
    last = Passage("kb-x#0", "X", "omega version", doc_id="kb-x")
    kb.upsert("acme", [first, last])
    assert kb.count("acme") == 1
    assert [p.text for p in kb.retriever("acme").search("version", 5)] == ["omega version"]


def test_delete_removes_and_ignores_unknown_ids(kb: KnowledgeIndex) -> None:
    kb.upsert("acme", [RESET, INVOICE, REFUND])
    retriever = kb.retriever("acme")
    kb.delete("acme", [INVOICE.id, "kb-unknown#7", ""])
    assert kb.count("acme") == 2
    assert INVOICE.id not in ids(retriever.search("invoices emailed month", 10))
    kb.delete("acme", [])
    kb.delete("acme", ["kb-unknown#8"])
    assert kb.count("acme") == 2


def test_delete_for_a_tenant_without_index_is_a_no_op(kb: KnowledgeIndex) -> None:
    kb.delete("nobody", ["a#0"])
    assert not kb.exists("nobody")


def test_count_and_exists(kb: KnowledgeIndex) -> None:
    assert not kb.exists("acme") and kb.count("acme") == 0
    kb.upsert("acme", [RESET])
    assert kb.exists("acme") and kb.count("acme") == 1
    kb.upsert("acme", [INVOICE, REFUND])
    assert kb.count("acme") == 3


def test_missing_tenant_raises_index_not_found_naming_the_tenant(kb: KnowledgeIndex) -> None:
    with pytest.raises(IndexNotFoundError) as info:
        kb.retriever("Globex Ltd")
    assert "'Globex Ltd'" in str(info.value)


def test_chunks_need_ids(kb: KnowledgeIndex) -> None:
    with pytest.raises(ValueError):
        kb.upsert("acme", [Passage("", "t", "x")])
    assert not kb.exists("acme")


# ---- tenant isolation ----------------------------------------------------------------------------


def test_tenant_never_sees_another_tenants_passage(kb: KnowledgeIndex) -> None:
    secret = chunk("kb-secret", 0, "Merger plan", "Confidential",
                   "Globex acquires Initech for forty million dollars next quarter.")
    kb.upsert("acme", [RESET, INVOICE])
    kb.upsert("globex", [secret])
    acme = kb.retriever("acme")
    for query in (secret.text, secret.title, f"{secret.title} {secret.section} {secret.text}", "Initech"):
        assert secret.id not in ids(acme.search(query, 100))
    assert ids(kb.retriever("globex").search(secret.text, 5)) == [secret.id]
    assert (kb.count("acme"), kb.count("globex")) == (2, 1)


def test_tenants_that_collide_after_lowercasing_stay_separate(kb: KnowledgeIndex) -> None:
    tenants = ["Acme", "acme", "ACME", "acme!"]
    for n, tenant in enumerate(tenants):
        kb.upsert(tenant, [Passage(f"t{n}#0", "Widget", f"widget manual of tenant number {n}", doc_id=f"t{n}")])
    for n, tenant in enumerate(tenants):
        assert kb.count(tenant) == 1
        assert ids(kb.retriever(tenant).search("widget manual tenant", 10)) == [f"t{n}#0"]


HOSTILE_TENANTS = ["../x", "x/../../y", "A B", "Zürich Café ☕", "東京", "a" * 64, ".", "-", "_t", "*?<>|"]


def test_hostile_tenant_strings(kb: KnowledgeIndex, storage: dict[str, str]) -> None:
    for n, tenant in enumerate(HOSTILE_TENANTS):
        kb.upsert(tenant, [Passage(f"h{n}#0", "Gadget", f"gadget guide {n}", doc_id=f"h{n}")])
    for n, tenant in enumerate(HOSTILE_TENANTS):
        assert kb.exists(tenant)
        assert ids(kb.retriever(tenant).search("gadget guide", 20)) == [f"h{n}#0"]
    if storage["backend"] == "tantivy":
        root = Path(storage["root"]).resolve()
        children = {p.name for p in root.iterdir()}
        assert children == {tenant_slug(t) for t in HOSTILE_TENANTS}  # nothing outside root
        assert all((root / name / "TENANT").exists() for name in children)
        assert {(root / tenant_slug(t) / "TENANT").read_text() for t in HOSTILE_TENANTS} == set(HOSTILE_TENANTS)


# ---- rebuild ---------------------------------------------------------------------------------------


def _corpus(tag: str, n: int) -> Iterator[Passage]:
    for i in range(n):
        yield chunk(f"{tag}-{i // 4}", i % 4, f"Widget {tag} {i}", f"{tag} section",
                    f"The widget {tag} manual, page {i}: tighten bolt {i} before use.")


def test_rebuild_with_zero_downtime(factory: Factory, storage: dict[str, str]) -> None:
    # OpenSearch: the default grace before the old index is dropped (the fixture shortens it)
    kb = factory(old_index_grace_s=1.0) if storage["backend"] == "opensearch" else factory()
    kb.upsert("acme", list(_corpus("legacy", 200)))
    retriever = kb.retriever("acme")
    stop = threading.Event()
    rebuilding = threading.Event()
    stats = {"searches": 0, "during_rebuild": 0, "errors": 0, "empty": 0, "saw_fresh": 0}
    errors: list[BaseException] = []

    def search_forever() -> None:
        while not stop.is_set():
            try:
                hits = retriever.search("widget manual bolt", 5)
            except Exception as err:  # noqa: BLE001 - counted, and the first few kept for the message
                stats["errors"] += 1
                errors.append(err)
                continue
            stats["searches"] += 1
            stats["during_rebuild"] += rebuilding.is_set()
            stats["empty"] += not hits
            stats["saw_fresh"] += bool(hits) and "fresh" in hits[0].title

    thread = threading.Thread(target=search_forever, daemon=True)
    thread.start()
    time.sleep(0.2)
    rebuilding.set()
    generation = kb.rebuild("acme", _corpus("fresh", 3000))
    rebuilding.clear()
    time.sleep(0.3)
    stop.set()
    thread.join(timeout=30)

    assert stats["errors"] == 0, errors[:3]
    assert stats["empty"] == 0
    assert stats["during_rebuild"] > 10, stats
    assert stats["saw_fresh"] > 0, stats
    assert generation == 2
    assert kb.count("acme") == 3000
    assert retriever.search("legacy", 10) == []
    assert all("fresh" in p.title for p in retriever.search("widget manual bolt", 50))
    # a retriever opened after the swap and another rebuild agree
    assert kb.rebuild("acme", _corpus("third", 10)) == 3
    assert retriever.count() == kb.retriever("acme").count() == 10  # type: ignore[attr-defined]


def test_rebuild_of_a_new_tenant_creates_it(kb: KnowledgeIndex) -> None:
    generation = kb.rebuild("newco", [RESET, INVOICE])
    assert generation >= 1
    assert kb.rebuild("newco", [RESET, INVOICE]) == generation + 1
    assert kb.count("newco") == 2
    kb.upsert("newco", [REFUND])
    assert kb.count("newco") == 3


def test_failed_rebuild_leaves_the_live_index_whole(kb: KnowledgeIndex) -> None:
    kb.upsert("acme", [RESET, INVOICE])

    def broken() -> Iterator[Passage]:
        yield from _corpus("half", 50)
        raise RuntimeError("the import source broke")

    with pytest.raises(RuntimeError, match="broke"):
        kb.rebuild("acme", broken())
    assert kb.count("acme") == 2
    assert ids(kb.retriever("acme").search("reset password", 1)) == [RESET.id]
    assert kb.rebuild("acme", [REFUND]) == 2  # the failed attempt left nothing in the way
    assert kb.count("acme") == 1


def test_two_rebuilds_at_once_leave_one_whole_index(factory: Factory, storage: dict[str, str]) -> None:
    # tantivy: the second waits for the writer lock, then gives up; OpenSearch: the second swaps
    # first and the slow one's swap finds the alias moved. Either way one fails, none mixes.
    kb = factory(busy_timeout_s=0.3) if storage["backend"] == "tantivy" else factory()
    kb.upsert("acme", [RESET])
    started, release = threading.Event(), threading.Event()

    def slow_chunks() -> Iterator[Passage]:
        yield from _corpus("slow", 20)
        started.set()
        release.wait(60)
        yield from _corpus("slower", 20)

    outcome: dict[str, object] = {}

    def rebuild(name: str, chunks: Iterator[Passage]) -> None:
        try:
            outcome[name] = kb.rebuild("acme", chunks)
        except KnowledgeBaseBusyError as err:
            outcome[name] = err

    slow = threading.Thread(target=rebuild, args=("slow", slow_chunks()))
    slow.start()
    assert started.wait(60)
    rebuild("fast", _corpus("fast", 10))
    release.set()
    slow.join(120)
    failed = [name for name, result in outcome.items() if isinstance(result, KnowledgeBaseBusyError)]
    assert len(failed) == 1, outcome
    winner, expected = ("fast", 10) if failed == ["slow"] else ("slow", 40)
    assert kb.count("acme") == expected
    titles = {p.title.split()[1] for p in kb.retriever("acme").search("widget manual bolt", 100)}
    assert titles == ({"slow", "slower"} if winner == "slow" else {"fast"})
    if isinstance(kb, OpenSearchKnowledgeIndex):
        live = kb.generation("acme")
        assert kb._holders("acme") == [kb.index_name("acme", live or 0)]
        assert list(kb._generations("acme")) == [live]  # the loser's index is gone too


# ---- other writers -------------------------------------------------------------------------------


def test_second_instance_writes_are_seen_by_the_first(factory: Factory) -> None:
    first, second = factory(), factory()
    first.upsert("acme", [RESET])
    retriever = first.retriever("acme")
    second.upsert("acme", [INVOICE])
    assert ids(retriever.search("invoices", 5)) == [INVOICE.id]
    second.delete("acme", [RESET.id])
    assert retriever.search("password", 5) == []
    second.rebuild("acme", [REFUND])
    assert ids(retriever.search("refunds invoices", 5)) == [REFUND.id]
    assert first.count("acme") == 1


def _child(storage: dict[str, str], code: str, *args: object) -> subprocess.Popen[str]:
    """A Python child process running `code` with `kb` (a fresh index over `storage`) and `args`."""
    prelude = (
        "import json, sys\n"
        "from pathlib import Path\n"
        "from adaptive_rag.domain import Passage\n"
        "from adaptive_rag.knowledge.indexes import OpenSearchKnowledgeIndex, TantivyKnowledgeIndex\n"
        "storage, args = json.loads(sys.argv[1]), json.loads(sys.argv[2])\n"
        "kb = (TantivyKnowledgeIndex(Path(storage['root'])) if storage['backend'] == 'tantivy'\n"
        "      else OpenSearchKnowledgeIndex(storage['url'], storage['prefix'], old_index_grace_s=0.2))\n"
    )
    return subprocess.Popen(
        [sys.executable, "-c", prelude + code, json.dumps(storage), json.dumps(list(args))],
        cwd=REPO, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )


def _finish(child: subprocess.Popen[str]) -> str:
    out, err = child.communicate(timeout=120)
    assert child.returncode == 0, err[-3000:]
    return out


def test_writes_from_another_process_are_seen(kb: KnowledgeIndex, storage: dict[str, str]) -> None:
    kb.upsert("acme", [RESET])
    retriever = kb.retriever("acme")
    _finish(_child(storage, (
        "kb.upsert('acme', [Passage('proc#0', 'Shipping', 'Parcels ship from Rotterdam daily.',"
        " doc_id='proc', section='Shipping')])\n"
    )))
    (hit,) = retriever.search("parcels Rotterdam", 5)
    assert (hit.id, hit.doc_id, hit.section) == ("proc#0", "proc", "Shipping")
    _finish(_child(storage, "print(kb.rebuild('acme', [Passage('only#0', 'Only', 'the only chunk left')]))\n"))
    assert ids(retriever.search("only chunk parcels password", 5)) == ["only#0"]
    assert kb.count("acme") == 1


# ---- tantivy specifics ------------------------------------------------------------------------------


def test_tantivy_readers_of_a_removed_generation_keep_working(tmp_path: Path) -> None:
    from adaptive_rag.retrieval.tantivy_index import TantivyRetriever

    kb = TantivyKnowledgeIndex(tmp_path)
    kb.rebuild("acme", [RESET, INVOICE])
    old_dir = kb.tenant_dir("acme") / "gen-000001"
    pinned = TantivyRetriever(old_dir)
    kb.rebuild("acme", [REFUND])
    assert not old_dir.exists()  # removed after the swap
    # its files are unlinked but still mapped: the old reader answers as before
    assert ids(pinned.search("reset password", 1)) == [RESET.id]
    assert pinned.count() == 2
    assert [p.name for p in kb.tenant_dir("acme").iterdir() if p.name.startswith("gen-")] == ["gen-000002"]


def test_tantivy_writer_held_by_another_process_is_busy(tmp_path: Path) -> None:
    storage = {"backend": "tantivy", "root": str(tmp_path)}
    kb = TantivyKnowledgeIndex(tmp_path, busy_timeout_s=0.2)
    kb.upsert("acme", [RESET])
    holder = _child(storage, (
        "import tantivy\n"
        "writer = tantivy.Index.open(args[0]).writer(15_000_000, 1)\n"
        "print('holding', flush=True)\n"
        "sys.stdin.read()\n"
    ), str(kb.tenant_dir("acme") / "gen-000001"))
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "holding"
        with pytest.raises(KnowledgeBaseBusyError, match="another writer"):
            kb.upsert("acme", [INVOICE])
        assert kb.count("acme") == 1  # and searches carry on
    finally:
        _finish(holder)
    kb.upsert("acme", [INVOICE])
    assert kb.count("acme") == 2


def test_tantivy_rebuild_in_another_process_makes_writes_busy(tmp_path: Path) -> None:
    storage = {"backend": "tantivy", "root": str(tmp_path)}
    kb = TantivyKnowledgeIndex(tmp_path, busy_timeout_s=0.2)
    kb.upsert("acme", [RESET])
    rebuilder = _child(storage, (
        "def chunks():\n"
        "    yield Passage('rebuilt#0', 'Rebuilt', 'rebuilt content', doc_id='rebuilt')\n"
        "    print('rebuilding', flush=True)\n"
        "    sys.stdin.read()\n"
        "print(kb.rebuild('acme', chunks()))\n"
    ))
    try:
        assert rebuilder.stdout is not None and rebuilder.stdout.readline().strip() == "rebuilding"
        with pytest.raises(KnowledgeBaseBusyError, match="'acme'"):
            kb.upsert("acme", [INVOICE])
        with pytest.raises(KnowledgeBaseBusyError):
            kb.rebuild("acme", [INVOICE])
        assert ids(kb.retriever("acme").search("password", 5)) == [RESET.id]
    finally:
        out = _finish(rebuilder)
    assert out.strip() == "2"
    assert ids(kb.retriever("acme").search("rebuilt password", 5)) == ["rebuilt#0"]


def test_tantivy_writers_in_threads_queue_up(tmp_path: Path) -> None:
    kb = TantivyKnowledgeIndex(tmp_path, busy_timeout_s=30)
    batches = [[Passage(f"t{t}-{i}#0", "Thread", f"thread {t} chunk {i}")] for t in range(4) for i in range(10)]
    threads = [threading.Thread(target=kb.upsert, args=("acme", batch)) for batch in batches]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert kb.count("acme") == len(batches)


# ---- OpenSearch specifics ----------------------------------------------------------------------------


def test_opensearch_names_and_single_live_index(opensearch_url: str) -> None:
    prefix = f"arag-kbtest-{uuid.uuid4().hex[:8]}"
    kb = OpenSearchKnowledgeIndex(opensearch_url, prefix, old_index_grace_s=0)
    try:
        kb.upsert("Acme", [RESET])
        alias = f"{prefix}-{tenant_slug('Acme')}"
        assert kb.alias("Acme") == alias
        assert kb.generation("Acme") == 1
        kb.rebuild("Acme", [INVOICE])
        client = kb._client
        assert sorted(client.indices.get_alias(name=alias)) == [f"{alias}-g2"]
        assert sorted(client.indices.get(index=f"{prefix}-*")) == [f"{alias}-g2"]  # g1 dropped
    finally:
        _delete_indices(kb._client, prefix)
        kb.close()


def test_opensearch_unreachable_cluster_is_retriever_unavailable() -> None:
    url = f"http://127.0.0.1:{free_port()}"
    kb = OpenSearchKnowledgeIndex(url, "arag-kb", timeout_s=2)
    calls = {
        "upsert": lambda: kb.upsert("acme", [RESET]),
        "delete": lambda: kb.delete("acme", [RESET.id]),
        "rebuild": lambda: kb.rebuild("acme", [RESET]),
        "exists": lambda: kb.exists("acme"),
        "count": lambda: kb.count("acme"),
        "retriever": lambda: kb.retriever("acme"),
    }
    for name, call in calls.items():
        with pytest.raises(RetrieverUnavailableError, match="unreachable"):
            call()
            pytest.fail(name)


# ---- factory --------------------------------------------------------------------------------------


def test_open_knowledge_index_picks_the_backend(tmp_path: Path) -> None:
    embedded = open_knowledge_index(Settings(retriever="tantivy", kb_dir=tmp_path / "kb", title_boost=1.5))
    assert isinstance(embedded, TantivyKnowledgeIndex)
    assert (embedded.root, embedded.title_boost) == (tmp_path / "kb", 1.5)
    with pytest.raises(ConfigurationError, match="OPENSEARCH_URL"):
        open_knowledge_index(Settings(retriever="opensearch", opensearch_url=None))
    remote = open_knowledge_index(
        Settings(retriever="opensearch", opensearch_url="http://127.0.0.1:9", kb_index_prefix="kb-x")
    )
    assert isinstance(remote, OpenSearchKnowledgeIndex)
    assert remote.alias("acme") == f"kb-x-{tenant_slug('acme')}"
    remote.close()
