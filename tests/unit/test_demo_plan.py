"""What `python -m services.demo` starts and what it uses, from the environment: embedded parts by
default, the configured servers when their URLs are set (nothing is started here)."""

from __future__ import annotations

from pathlib import Path

import pytest

from services.demo.__main__ import load_questions, plan
from workers.pools import settings_env

SERVER_VARIABLES = ("REDIS_URL", "DATABASE_URL", "OPENSEARCH_URL", "TRITON_URL", "TRITON_GRPC_URL",
                    "LLM_BASE_URL", "ARAG_RETRIEVER", "ARAG_OPENSEARCH_INDEX", "ARAG_CONCURRENCY_A")


@pytest.fixture(autouse=True)
def no_servers(monkeypatch, tmp_path):
    monkeypatch.chdir(tmp_path)  # no .env file
    for name in SERVER_VARIABLES:
        monkeypatch.delenv(name, raising=False)


def test_embedded_defaults_start_everything_locally(tmp_path):
    chosen = plan(tmp_path / "demo")
    settings = chosen.settings
    assert chosen.start_triton
    assert settings.redis_url is None and settings.broker_dir == tmp_path / "demo" / "broker"
    assert settings.database_url == f"sqlite:///{(tmp_path / 'demo' / 'arag.db').resolve()}"
    assert settings.retriever == "tantivy" and settings.index_dir == (tmp_path / "demo" / "index").resolve()
    assert {settings.pool_concurrency(p) for p in ("A", "B", "C", "shadow")} == {1}
    # Child processes (pools, front door) read the same choices back from their environment.
    env = settings_env(settings)
    assert env["DATABASE_URL"] == settings.database_url and env["ARAG_BROKER_DIR"] == str(settings.broker_dir)


def test_configured_servers_are_used_and_not_started(tmp_path, monkeypatch):
    monkeypatch.setenv("REDIS_URL", "redis://127.0.0.1:6399/0")
    monkeypatch.setenv("DATABASE_URL", "postgresql+psycopg://arag@127.0.0.1:5433/arag")
    monkeypatch.setenv("OPENSEARCH_URL", "http://127.0.0.1:9200")
    monkeypatch.setenv("TRITON_URL", "127.0.0.1:8101")
    monkeypatch.setenv("LLM_BASE_URL", "http://127.0.0.1:8080/v1")
    monkeypatch.setenv("ARAG_CONCURRENCY_A", "3")
    chosen = plan(tmp_path / "demo")
    settings = chosen.settings
    assert not chosen.start_triton and settings.triton_grpc_url == "127.0.0.1:8101"
    assert settings.redis_url == "redis://127.0.0.1:6399/0"
    assert settings.database_url.startswith("postgresql+psycopg://")
    assert (settings.retriever, settings.opensearch_index) == ("opensearch", "arag-demo")
    assert settings.llm_base_url == "http://127.0.0.1:8080/v1"
    assert settings.concurrency_a == 3 and settings.concurrency_b == 1
    assert "Redis" in chosen.using["broker"] and "OpenSearch" in chosen.using["retriever"]


def test_per_tier_keeps_the_first_questions_of_each_expected_tier():
    questions = load_questions(Path(__file__).resolve().parents[2] / "demo" / "questions.json", 1)
    assert [q["expected_tier"] for q in questions] == ["A", "B", "C"]
