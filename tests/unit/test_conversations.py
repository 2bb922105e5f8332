"""Conversations through the Answer use case (in-memory ports): a follow-up is rewritten before
small talk, routing and retrieval see it, the rewrite is recorded beside the original and comes
back in the reply (live, replayed and from GetResult); another tenant's, an expired or a
malformed conversation id is refused before anything is recorded."""

from __future__ import annotations

import dataclasses
import time

import pytest
from fakes import FakeLLM
from test_serving import KEY, run, service, soon

from adaptive_rag.contracts import Tier
from adaptive_rag.errors import ConversationNotFoundError, InvalidRequestError
from adaptive_rag.contracts import CallError
from adaptive_rag.serving.commands import Answer, GetResult
from adaptive_rag.serving.context import CallProgress


def ask(svc, query: str, conversation_id: str | None = None, key: str = KEY, client_id: str | None = None):
    return run(svc.answer(Answer(key, query.encode(), client_id, soon(), conversation_id), CallProgress()))


def test_an_answer_starts_a_conversation_and_a_follow_up_is_searched_as_a_standalone_question():
    svc, store, queue, _ = service()
    first = ask(svc, "What is a novel coronavirus?")
    assert first.conversation_id == first.request_id and first.rewritten_query == "" and first.rewrite == ""
    follow = ask(svc, "how does it spread?", first.conversation_id)
    assert follow.conversation_id == first.conversation_id != follow.request_id
    assert (follow.rewritten_query, follow.rewrite) == ("How does a novel coronavirus spread?", "rules")
    assert queue.tasks[-1].query == "How does a novel coronavirus spread?"  # what the worker searches
    recorded = store.requests[follow.request_id]
    assert recorded.query == "how does it spread?"  # the original, beside the rewrite
    assert (recorded.standalone_query, recorded.rewrite) == ("How does a novel coronavirus spread?", "rules")
    # A third turn resolves against the second's standalone form.
    third = ask(svc, "and the flu?", first.conversation_id)
    assert third.rewritten_query == "How does the flu spread?"


def test_the_router_sees_the_rewritten_question():
    svc, store, queue, _ = service()
    svc.router.tiers["how does it spread?"] = "A"  # what the turn says as typed
    first = ask(svc, "What is a novel coronavirus?")
    follow = ask(svc, "how does it spread?", first.conversation_id)
    assert follow.rewritten_query == "How does a novel coronavirus spread?"
    assert follow.decision.tier is Tier.B  # routed on the rewrite, not the typed text


def test_a_rewritten_comparison_goes_to_c_whatever_the_router_says():
    svc, store, queue, _ = service()
    first = ask(svc, "What is a novel coronavirus?")
    follow = ask(svc, "compare it with the flu", first.conversation_id)
    assert follow.rewritten_query == "Compare a novel coronavirus with the flu"
    assert follow.decision.tier is Tier.C and follow.decision.reason.endswith("several questions in one: C")


def test_a_turn_that_is_small_talk_stays_small_talk():
    svc, store, queue, _ = service()
    first = ask(svc, "What is a novel coronavirus?")
    thanks = ask(svc, "thanks, that helped!", first.conversation_id)  # "that": a pronoun
    assert thanks.rewritten_query == "" and thanks.decision.model_name == "small_talk"


def test_the_rewrite_comes_back_from_get_result_and_a_replay():
    svc, store, queue, _ = service()
    first = ask(svc, "What is a novel coronavirus?")
    follow = ask(svc, "how does it spread?", first.conversation_id, client_id="turn-2")
    stored = run(svc.get_result(GetResult(KEY, follow.request_id), CallProgress()))
    assert (stored.conversation_id, stored.rewritten_query, stored.rewrite) == (
        first.conversation_id, "How does a novel coronavirus spread?", "rules")
    replayed = ask(svc, "how does it spread?", first.conversation_id, client_id="turn-2")
    assert replayed.replayed and replayed.request_id == follow.request_id
    assert replayed.rewritten_query == "How does a novel coronavirus spread?"


def test_another_tenants_conversation_is_not_found_and_nothing_is_recorded():
    svc, store, queue, _ = service()
    store.add_key("arag_other", "globex")
    first = ask(svc, "What is a novel coronavirus?")
    before = dict(store.requests)
    svc._has_knowledge_base = lambda tenant: True
    with pytest.raises(ConversationNotFoundError) as refused:
        ask(svc, "how does it spread?", first.conversation_id, key="arag_other")
    assert refused.value.reason is CallError.CONVERSATION_NOT_FOUND
    with pytest.raises(ConversationNotFoundError):
        ask(svc, "how does it spread?", "0" * 32)
    assert store.requests == before


def test_a_conversation_past_its_retention_is_not_found():
    svc, store, queue, _ = service()
    svc.config = dataclasses.replace(svc.config, conversation_retention_s=60.0)
    first = ask(svc, "What is a novel coronavirus?")
    store.requests[first.request_id].created_at = time.time() - 120
    with pytest.raises(ConversationNotFoundError):
        ask(svc, "how does it spread?", first.conversation_id)


@pytest.mark.parametrize("conversation_id", ["", "x" * 65, "has space", "bad\x00id", "x" * 100_000])
def test_a_malformed_or_huge_conversation_id_is_an_invalid_argument(conversation_id: str):
    svc, store, queue, _ = service()
    with pytest.raises(InvalidRequestError) as refused:
        ask(svc, "how does it spread?", conversation_id)
    assert refused.value.reason is CallError.INVALID_CONVERSATION_ID
    assert store.requests == {}


def test_a_follow_up_no_rule_fits_goes_to_the_rewriting_reader():
    svc, store, queue, _ = service()
    svc.rewriter = FakeLLM(["Can children get the vaccine too?"])
    first = ask(svc, "Who can get the vaccine?")
    follow = ask(svc, "does the same apply to kids?", first.conversation_id)
    assert (follow.rewritten_query, follow.rewrite) == ("Can children get the vaccine too?", "reader")
    assert queue.tasks[-1].query == "Can children get the vaccine too?"
