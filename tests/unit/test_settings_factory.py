"""Settings from the environment and the factories that pick adapters from them."""

from __future__ import annotations

from pathlib import Path

import pydantic
import pytest
import urllib3

from adaptive_rag.domain import Passage
from adaptive_rag.errors import ConfigurationError, IndexNotFoundError
from adaptive_rag.llm import build_llm
from adaptive_rag.llm.openai_compat import OpenAICompatibleLLM
from adaptive_rag.retrieval import build_index, open_retriever
from adaptive_rag.retrieval.tantivy_index import TantivyRetriever
from adaptive_rag.settings import multi_step_strategy, Settings


def env_settings() -> Settings:
    return Settings(_env_file=None)


def test_defaults_run_everything_embedded() -> None:
    s = env_settings()
    assert s.retriever == "tantivy"
    assert s.opensearch_url is None and s.llm_base_url is None
    assert (s.top_k, s.max_steps, s.max_passages) == (5, 4, 6)
    # tier C: the reader the suite runs (gemma-270m) has no tuned choice, so the default: evidence
    assert s.multi_step is None and multi_step_strategy(s) == "evidence"
    assert s.data_dir == Path("../shared/data")


def test_settings_from_environment(monkeypatch, tmp_path) -> None:
    monkeypatch.setenv("ARAG_RETRIEVER", "opensearch")
    monkeypatch.setenv("OPENSEARCH_URL", "http://search.test:9200")
    monkeypatch.setenv("ARAG_OPENSEARCH_INDEX", "tenant-1")
    monkeypatch.setenv("LLM_BASE_URL", "http://llm.test")
    monkeypatch.setenv("LLM_MODEL", "qwen")
    monkeypatch.setenv("LLM_API", "completions")
    monkeypatch.setenv("LLM_MAX_RETRIES", "0")
    monkeypatch.setenv("ARAG_TOP_K", "7")
    monkeypatch.setenv("ARAG_MULTI_STEP", "ircot")
    monkeypatch.setenv("ARAG_DATA_DIR", str(tmp_path))
    monkeypatch.setenv("ARAG_TITLE_BOOST", "3.5")
    s = env_settings()
    assert s.retriever == "opensearch"
    assert s.opensearch_url == "http://search.test:9200"
    assert s.opensearch_index == "tenant-1"
    assert (s.llm_base_url, s.llm_model, s.llm_api, s.llm_max_retries) == (
        "http://llm.test", "qwen", "completions", 0,
    )
    assert (s.top_k, s.multi_step, s.data_dir, s.title_boost) == (7, "ircot", tmp_path, 3.5)


def test_env_names_are_case_insensitive(monkeypatch) -> None:
    monkeypatch.setenv("arag_top_k", "9")
    assert env_settings().top_k == 9


def test_constructor_arguments_by_field_name() -> None:
    assert Settings(_env_file=None, top_k=3, retriever="opensearch").top_k == 3


def test_dotenv_file_is_read(monkeypatch, tmp_path) -> None:
    (tmp_path / ".env").write_text("ARAG_MAX_STEPS=7\n")
    monkeypatch.chdir(tmp_path)
    assert Settings().max_steps == 7


@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("ARAG_RETRIEVER", "elasticsearch"),
        ("LLM_API", "responses"),
        ("ARAG_MULTI_STEP", "self_ask"),
        ("ARAG_TOP_K", "0"),
        ("ARAG_TOP_K", "many"),
        ("ARAG_MAX_STEPS", "17"),
        ("LLM_MAX_RETRIES", "-1"),
    ],
)
def test_invalid_values_are_validation_errors(monkeypatch, name: str, value: str) -> None:
    monkeypatch.setenv(name, value)
    with pytest.raises(pydantic.ValidationError):
        env_settings()


def test_build_llm_is_the_http_client_when_base_url_set(monkeypatch) -> None:
    def no_network(*args, **kwargs):
        raise AssertionError("build_llm must not call the endpoint")

    monkeypatch.setattr(urllib3.PoolManager, "urlopen", no_network)
    monkeypatch.setenv("LLM_BASE_URL", "http://llm.test:8000/")
    monkeypatch.setenv("LLM_MODEL", "served-model")
    monkeypatch.setenv("LLM_API_KEY", "sk-secret")
    monkeypatch.setenv("LLM_MAX_RETRIES", "1")
    monkeypatch.setenv("LLM_TIMEOUT", "7")
    llm = build_llm(env_settings())
    assert isinstance(llm, OpenAICompatibleLLM)
    assert llm.model == "served-model" and llm.api == "chat"
    assert llm.base_url == "http://llm.test:8000/v1"
    assert llm._headers["Authorization"] == "Bearer sk-secret"
    assert llm.timeout.read_timeout == 7.0
    assert llm._post.retry.stop.max_attempt_number == 2


def test_build_llm_missing_gguf_is_a_configuration_error(monkeypatch, tmp_path) -> None:
    monkeypatch.setenv("ARAG_GGUF_PATH", str(tmp_path / "absent.gguf"))
    with pytest.raises(ConfigurationError, match="GGUF model not found"):
        build_llm(env_settings())


def test_open_retriever_opensearch_without_url(monkeypatch) -> None:
    monkeypatch.setenv("ARAG_RETRIEVER", "opensearch")
    with pytest.raises(ConfigurationError, match="OPENSEARCH_URL"):
        open_retriever(env_settings())
    with pytest.raises(ConfigurationError, match="OPENSEARCH_URL"):
        build_index(env_settings(), [])


def test_open_retriever_tantivy_missing_index(monkeypatch, tmp_path) -> None:
    monkeypatch.setenv("ARAG_INDEX_DIR", str(tmp_path / "none"))
    with pytest.raises(IndexNotFoundError):
        open_retriever(env_settings())


def test_build_index_then_open_retriever_tantivy(monkeypatch, tmp_path) -> None:
    monkeypatch.setenv("ARAG_INDEX_DIR", str(tmp_path / "idx"))
    monkeypatch.setenv("ARAG_TITLE_BOOST", "4")
    settings = env_settings()
    docs = [Passage("1", "Danube", "A river in Europe."), Passage("2", "Alps", "Mountains.")]
    built = build_index(settings, docs)
    opened = open_retriever(settings)
    assert isinstance(opened, TantivyRetriever)
    assert opened.title_boost == 4.0 and built.count() == 2
    assert [p.id for p in opened.search("river", 5)] == ["1"]


def test_the_http_client_asks_for_log_probabilities_only_where_they_are_read(monkeypatch) -> None:
    from adaptive_rag.llm import logprob_llm

    monkeypatch.setenv("LLM_BASE_URL", "http://llm.test:8000/")
    plain = build_llm(env_settings())
    assert plain.logprobs is False
    assert logprob_llm(env_settings(), plain).logprobs is True  # the uncertainty drafts' own client
    monkeypatch.setenv("ARAG_READER_ABSTAIN_MIN_CONFIDENCE", "0.7")
    assert build_llm(env_settings()).logprobs is True  # the reader's calibrated gate reads them
    monkeypatch.delenv("ARAG_READER_ABSTAIN_MIN_CONFIDENCE")
    monkeypatch.setenv("ARAG_LLM_LOGPROBS", "true")
    assert build_llm(env_settings()).logprobs is True
