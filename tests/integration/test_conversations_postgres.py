"""A conversation through the Answer use case and a worker's run on a real PostgreSQL (records
and knowledge base rows through the Alembic migrations) and a real tantivy knowledge base: the
follow-up is rewritten, recorded beside the original, searched as rewritten, and answered in the
tenant's answer style (read by the worker's own resources from the records); another tenant's
conversation is not found."""

from __future__ import annotations

import asyncio
import sys
import time
import uuid
from pathlib import Path

import pytest
from sqlalchemy import text

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "unit"))  # the unit fakes
from fakes import FakeLLM  # noqa: E402
from frontdoor_fakes import FakeQueue, FakeRouter, FakeWaiter  # noqa: E402

from adaptive_rag.contracts import AnswerStyle, Tier  # noqa: E402
from adaptive_rag.errors import ConversationNotFoundError  # noqa: E402
from adaptive_rag.knowledge.documents import Document, Section  # noqa: E402
from adaptive_rag.knowledge.service import open_knowledge_service  # noqa: E402
from adaptive_rag.serving.answering import Delivery, answer_task  # noqa: E402
from adaptive_rag.serving.commands import Answer  # noqa: E402
from adaptive_rag.serving.context import AdmissionConfig, CallProgress  # noqa: E402
from adaptive_rag.serving.service import AnswerService  # noqa: E402
from adaptive_rag.settings import Settings  # noqa: E402
from adaptive_rag.storage import RecordStore, make_engine, upgrade_database  # noqa: E402
from workers.tasks import WorkerResources  # noqa: E402

pytestmark = pytest.mark.integration

DOCUMENTS = [
    Document("novel", "What is a novel coronavirus?", (Section("", "A novel coronavirus is a new "
             "coronavirus that has not been identified in people before."),)),
    Document("spread", "How does the novel coronavirus spread?", (Section("", "The novel coronavirus "
             "spreads between people through respiratory droplets when someone coughs or sneezes."),)),
    Document("masks", "Should I wear a mask?", (Section("", "Wear a mask in crowded indoor places."),)),
]


class Resources(WorkerResources):
    """The worker's own resources (tenant retrievers, thresholds and style from the records), with
    a scripted reader instead of a model."""

    def llm(self):
        return self._reader


@pytest.fixture
def stack(postgres_url, tmp_path):
    upgrade_database(postgres_url)
    engine = make_engine(postgres_url)
    with engine.begin() as conn:
        conn.execute(text("TRUNCATE feedback, results, routing_decisions, requests, api_keys, "
                          "kb_documents, knowledge_bases RESTART IDENTITY CASCADE"))
    settings = Settings(_env_file=None, database_url=postgres_url, kb_dir=tmp_path / "kb", retriever="tantivy")
    knowledge = open_knowledge_service(settings, engine)
    knowledge.upsert("acme", DOCUMENTS)
    knowledge.upsert("globex", DOCUMENTS[:1])
    store = RecordStore(engine)
    key, other = store.create_api_key("acme"), store.create_api_key("globex")
    resources = Resources(settings, store)
    resources._reader = FakeLLM(lambda prompt: "It spreads through respiratory droplets.")

    def work(task):
        return answer_task(task, store, resources, Delivery("worker-1", 1, may_retry=False))

    queue = FakeQueue(store, work=work)
    config = AdmissionConfig(max_query_chars=500, strategy_for=lambda tier: "single_step",
                             max_queue_depth={Tier.A: 5, Tier.B: 5, Tier.C: 5})
    service = AnswerService(store, queue, FakeWaiter(queue), FakeRouter(), config,
                            has_knowledge_base=knowledge.has_knowledge_base)
    yield service, store, knowledge, resources, (key, other)
    service.close()
    engine.dispose()


def ask(service, key: str, query: str, conversation_id: str | None = None):
    command = Answer(key, query.encode(), uuid.uuid4().hex, time.monotonic() + 30, conversation_id)
    return asyncio.run(service.answer(command, CallProgress()))


def test_a_follow_up_is_rewritten_recorded_searched_and_answered_in_the_tenants_style(stack):
    service, store, knowledge, resources, (key, other) = stack
    first = ask(service, key, "What is a novel coronavirus?")
    assert first.result.answerable and first.conversation_id == first.request_id
    follow = ask(service, key, "how does it spread?", first.conversation_id)
    assert (follow.rewritten_query, follow.rewrite) == ("How does a novel coronavirus spread?", "rules")
    view = store.get_request(follow.request_id)
    assert (view.query, view.standalone_query, view.conversation_id) == (
        "how does it spread?", "How does a novel coronavirus spread?", first.conversation_id)
    # Searched as rewritten: the spread article comes first (as typed, "it" matches nothing).
    assert follow.result.sources[0].id.startswith("spread#")
    # The tenant's style (support, the deployment's default): a full answer citing a source.
    assert follow.result.answer == "It spreads through respiratory droplets. [1]"
    assert "customer" in resources._reader.prompts[-1]


def test_the_operators_short_style_reaches_the_worker_and_other_tenants_cannot_continue(stack):
    service, store, knowledge, resources, (key, other) = stack
    knowledge.set_answer_style("acme", AnswerStyle.SHORT)
    resources._abstentions = None  # the worker's cache, as after its few seconds of TTL
    first = ask(service, key, "What is a novel coronavirus?")
    assert first.result.answer == "It spreads through respiratory droplets"  # the span reader's clean-up
    with pytest.raises(ConversationNotFoundError):
        ask(service, other, "how does it spread?", first.conversation_id)
