"""Conversations and answer styles at the gRPC boundary (in process, loopback, fakes behind):
conversation_id in and out, the rewritten question in the reply, NOT_FOUND for another tenant's
conversation, INVALID_ARGUMENT for a malformed or huge id (the one status table), and the
tenant's answer style in DescribeKnowledgeBase."""

from __future__ import annotations

import grpc
import pytest
from test_frontdoor import AUTH, OTHER_AUTH, Harness, make_settings, status_of, told

from adaptive_rag.contracts import AnswerStyle, CallError
from services.frontdoor.stubs import pb2


@pytest.fixture
def harness():
    h = Harness(make_settings())
    yield h
    h.close()


def test_a_follow_up_carries_its_conversation_and_shows_its_rewrite(harness):
    first, _ = harness.answer("What is a novel coronavirus?")
    assert first.conversation_id == first.request_id and first.rewritten_query == "" and first.rewrite == ""
    follow, _ = harness.answer("how does it spread?", conversation_id=first.conversation_id)
    assert follow.conversation_id == first.conversation_id
    assert (follow.rewritten_query, follow.rewrite) == ("How does a novel coronavirus spread?", "rules")
    assert follow.answer == "answer to How does a novel coronavirus spread?"
    stored = harness.stub.GetResult(pb2.GetResultRequest(request_id=follow.request_id), metadata=AUTH)
    assert (stored.conversation_id, stored.rewritten_query) == (first.conversation_id, follow.rewritten_query)


def test_another_tenants_conversation_is_not_found(harness):
    first, _ = harness.answer("What is a novel coronavirus?")
    recorded = dict(harness.store.requests)
    for conversation_id in (first.conversation_id, "f" * 32):  # globex's view: both unknown
        error = status_of(harness.answer, "how does it spread?", metadata=OTHER_AUTH,
                          conversation_id=conversation_id)
        assert error.code() is grpc.StatusCode.NOT_FOUND and told(error, CallError.CONVERSATION_NOT_FOUND)
    assert harness.store.requests == recorded


@pytest.mark.parametrize("conversation_id", ["", "x" * 65, "two words", "x" * 300_000])
def test_a_malformed_or_huge_conversation_id_is_invalid_argument(harness, conversation_id):
    error = status_of(harness.answer, "how does it spread?", conversation_id=conversation_id)
    assert error.code() is grpc.StatusCode.INVALID_ARGUMENT
    assert error.trailing_metadata() is not None
    if len(conversation_id) < 1000:  # a huge body is refused by the size guard, before parsing
        assert told(error, CallError.INVALID_CONVERSATION_ID)


def test_describe_shows_the_tenants_answer_style(harness):
    info = harness.kb.DescribeKnowledgeBase(pb2.DescribeKnowledgeBaseRequest(), metadata=AUTH)
    assert (info.answer_style, info.answer_style_source) == ("support", "deployment setting")
    harness.knowledge.set_answer_style("acme", AnswerStyle.SHORT)
    info = harness.kb.DescribeKnowledgeBase(pb2.DescribeKnowledgeBaseRequest(), metadata=AUTH)
    assert (info.answer_style, info.answer_style_source) == ("short", "tenant")
