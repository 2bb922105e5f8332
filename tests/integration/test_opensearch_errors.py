"""OpenSearchRetriever fails with precise, actionable errors."""

from __future__ import annotations

import uuid

import pytest

from adaptive_rag.domain import Passage
from adaptive_rag.errors import ConfigurationError, IndexNotFoundError, RetrieverUnavailableError
from adaptive_rag.retrieval.opensearch import OpenSearchRetriever
from infra.local.servers import free_port

pytestmark = pytest.mark.integration


@pytest.fixture
def closed_url() -> str:
    return f"http://127.0.0.1:{free_port()}"


def test_unreachable_cluster_raises_retriever_unavailable(closed_url: str) -> None:
    retriever = OpenSearchRetriever(closed_url, "arag-test", timeout_s=2)
    for call in (lambda: retriever.search("capital of France", 3), retriever.count):
        with pytest.raises(RetrieverUnavailableError) as info:
            call()
        assert closed_url in str(info.value)


def test_unreachable_cluster_on_build(closed_url: str) -> None:
    retriever = OpenSearchRetriever(closed_url, "arag-test", timeout_s=2)
    with pytest.raises(RetrieverUnavailableError, match="unreachable"):
        retriever.build([Passage("1", "t", "x")])


def test_url_password_is_not_echoed() -> None:
    url = f"http://admin:s3cret@127.0.0.1:{free_port()}"
    with pytest.raises(RetrieverUnavailableError) as info:
        OpenSearchRetriever(url, "arag-test", timeout_s=2).count()
    assert "s3cret" not in str(info.value)
    assert "admin:***@127.0.0.1" in str(info.value)


def test_missing_index_raises_index_not_found(opensearch_url: str) -> None:
    index = f"arag-missing-{uuid.uuid4().hex[:8]}"
    retriever = OpenSearchRetriever(opensearch_url, index)
    for call in (lambda: retriever.search("capital of France", 3), retriever.count):
        with pytest.raises(IndexNotFoundError) as info:
            call()
        assert index in str(info.value)
        assert "arag index --retriever opensearch" in str(info.value)


def test_missing_index_with_empty_query_does_not_touch_the_cluster(opensearch_url: str) -> None:
    retriever = OpenSearchRetriever(opensearch_url, f"arag-missing-{uuid.uuid4().hex[:8]}")
    assert retriever.search("   ", 3) == []


@pytest.mark.parametrize("name", ["", "Upper", "_under", "a/b", "a b", "a*b", "."])
def test_invalid_index_name_is_a_configuration_error(name: str) -> None:
    with pytest.raises(ConfigurationError):
        OpenSearchRetriever("http://127.0.0.1:9200", name)
