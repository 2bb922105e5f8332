"""What `python -m services.demo` starts and what it uses, from the environment: embedded parts by
default, the configured servers when their URLs are set (nothing is started here)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from services.demo.__main__ import load_questions
from services.demo.local import SERVER_CONCURRENCY, plan

SERVER_VARIABLES = ("REDIS_URL", "DATABASE_URL", "OPENSEARCH_URL", "TRITON_URL", "TRITON_GRPC_URL",
                    "LLM_BASE_URL", "ARAG_RETRIEVER", "ARAG_OPENSEARCH_INDEX", "ARAG_CONCURRENCY")


@pytest.fixture(autouse=True)
def no_servers(monkeypatch, tmp_path):
    monkeypatch.chdir(tmp_path)  # no .env file
    for name in SERVER_VARIABLES:
        monkeypatch.delenv(name, raising=False)


def test_embedded_defaults_start_everything_locally(tmp_path):
    chosen = plan(tmp_path / "demo")
    settings = chosen.settings
    library, workers = settings.library, settings.workers
    assert not chosen.start_triton and "the rules" in chosen.using["classifier"]  # nothing published
    assert workers.redis_url is None and workers.broker_dir == tmp_path / "demo" / "broker"
    assert library.database_url == f"sqlite:///{(tmp_path / 'demo' / 'arag.db').resolve()}"
    assert library.retriever == "tantivy" and library.kb_dir == (tmp_path / "demo" / "kb").resolve()
    # one shared llama-server, started by the stack; the pools are its HTTP clients
    assert chosen.start_llm_server and "one shared llama-server" in chosen.using["llm"]
    assert {p: workers.pool_concurrency(p) for p in ("A", "B", "C", "shadow")} == SERVER_CONCURRENCY
    # Child processes (pools, front door) read the same choices back from their environment.
    env = settings.env(base={})
    assert env["DATABASE_URL"] == library.database_url and env["ARAG_BROKER_DIR"] == str(workers.broker_dir)
    assert json.loads(env["ARAG_CONCURRENCY"]) == SERVER_CONCURRENCY
    assert env["ARAG_GRPC_LISTEN"] == settings.frontdoor.grpc_listen


def test_the_embedded_reader_is_a_model_copy_per_worker_process(tmp_path):
    chosen = plan(tmp_path / "demo", llm="embedded")
    assert not chosen.start_llm_server and "every worker process" in chosen.using["llm"]
    assert chosen.settings.library.llm_base_url is None
    assert {chosen.settings.workers.pool_concurrency(p) for p in ("A", "B", "C", "shadow")} == {1}


def test_configured_servers_are_used_and_not_started(tmp_path, monkeypatch):
    monkeypatch.setenv("REDIS_URL", "redis://127.0.0.1:6399/0")
    monkeypatch.setenv("DATABASE_URL", "postgresql+psycopg://arag@127.0.0.1:5433/arag")
    monkeypatch.setenv("OPENSEARCH_URL", "http://127.0.0.1:9200")
    monkeypatch.setenv("TRITON_URL", "127.0.0.1:8101")
    monkeypatch.setenv("LLM_BASE_URL", "http://127.0.0.1:8080/v1")
    monkeypatch.setenv("ARAG_CONCURRENCY", '{"A": 3}')
    chosen = plan(tmp_path / "demo")
    settings = chosen.settings
    library, workers = settings.library, settings.workers
    assert not chosen.start_triton and settings.classifier.triton_grpc_url == "127.0.0.1:8101"
    assert workers.redis_url == "redis://127.0.0.1:6399/0"
    assert library.database_url.startswith("postgresql+psycopg://")
    assert (library.retriever, library.kb_index_prefix) == ("opensearch", "arag-demo")
    assert library.llm_base_url == "http://127.0.0.1:8080/v1" and not chosen.start_llm_server
    assert workers.concurrency["A"] == 3 and workers.concurrency["B"] == 2  # configured: kept as is
    assert "Redis" in chosen.using["broker"] and "OpenSearch" in chosen.using["retriever"]


def test_per_tier_keeps_the_first_questions_of_each_expected_tier():
    questions = load_questions(Path(__file__).resolve().parents[2] / "demo" / "questions.json", 1)
    # the first B question's follow-up turn comes with it
    assert [q["expected_tier"] for q in questions] == ["A", "B", "B", "C"]
    assert questions[2]["follow_up_of"] == questions[1]["question"]


def test_a_published_classifier_version_is_served_by_a_local_triton(tmp_path, monkeypatch):
    from lab.harness.models import publish_length_router

    monkeypatch.setenv("ARAG_MODEL_REPOSITORY", str(tmp_path / "models"))
    publish_length_router(tmp_path / "models", 1)
    chosen = plan(tmp_path / "demo")
    assert chosen.start_triton and "versions [1]" in chosen.using["classifier"]


def test_the_results_table_says_a_reply_abstained_and_why() -> None:
    from rich.console import Console

    from services.demo.__main__ import results_table

    row = {"status": "OK", "question": "What is the capital of France?", "expected": "A", "tier": "B",
           "strategy": "single_step", "steps": 1, "routed_by": "complexity v1", "answer": "",
           "answerable": False, "unanswerable_reason": "the knowledge base does not cover the question",
           "sources": [{"id": "kb-025#0", "title": "Hub status", "score": 1.0}],
           "timings_ms": {"queue_wait": 1.0, "strategy": 2.0}, "latency_s": 0.5}
    console = Console(record=True, width=300)
    console.print(results_table([row]))
    assert "(abstained: the knowledge base does not cover the question)" in console.export_text()


def test_the_demo_asks_a_follow_up_only_with_the_question_it_follows(tmp_path):
    import json

    from services.demo.__main__ import DEMO, load_questions

    shipped = load_questions(DEMO / "questions.json", None)
    follow_ups = [q for q in shipped if "follow_up_of" in q]
    assert follow_ups and all(  # each follows a question asked before it
        any(p["question"] == q["follow_up_of"] for p in shipped[: shipped.index(q)]) for q in follow_ups)
    path = tmp_path / "questions.json"
    path.write_text(json.dumps([
        {"question": "first B", "expected_tier": "B"}, {"question": "second B", "expected_tier": "B"},
        {"question": "and then?", "follow_up_of": "second B", "expected_tier": "B"},
        {"question": "and so?", "follow_up_of": "first B", "expected_tier": "B"},
    ]))
    assert [q["question"] for q in load_questions(path, 1)] == ["first B", "and so?"]
    assert len(load_questions(path, None)) == 4
