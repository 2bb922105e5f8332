"""A request recorded but never enqueued (its front door died between the two) is not lost: the
relay publishes it again, a resend of it runs it, and every replay wait ends by the server's
deadline with the request id. Over the in-memory ports (`frontdoor_fakes`); the real front door
process, killed at that point, is `tests/integration/test_stranded_request.py`."""

from __future__ import annotations

import asyncio
import threading
import time

import grpc
import pytest
from frontdoor_fakes import FakeQueue, FakeRouter, FakeStore, FakeWaiter
from test_frontdoor import AUTH, Harness, make_settings, status_of, trailing

from adaptive_rag.contracts import RequestStatus, RoutingDecision, Tier
from adaptive_rag.errors import AnswerTimeoutError
from adaptive_rag.serving.admission import RESEND_PUBLISH_AFTER_S
from adaptive_rag.serving.commands import Answer, GetResult
from adaptive_rag.serving.context import AdmissionConfig, CallProgress
from adaptive_rag.serving.service import AnswerService
from services.frontdoor.stubs import pb2

KEY = "arag_key"
QUERY = b"compare"  # tier C with the fake router


class FrontDoorDied(BaseException):
    """Stands in for the process ending (`os._exit`) right after the row is committed."""


def service(unpublished_after_s: float | None = 0.05, delay_s: float = 0.0, die_after_record: bool = False,
            lost_after_s: float | None = None) -> tuple[AnswerService, FakeStore, FakeQueue, list]:
    store = FakeStore()
    store.add_key(KEY, "acme")
    queue = FakeQueue(store, delay_s=delay_s)
    seen: list = []

    def recorded(request_id: str) -> None:
        seen.append(("recorded", request_id))
        if die_after_record:
            raise FrontDoorDied(request_id)

    config = AdmissionConfig(max_query_chars=100, max_queue_depth={Tier.A: 5, Tier.B: 5, Tier.C: 5},
                             strategy_for=lambda tier: "no_retrieval", unpublished_after_s=unpublished_after_s,
                             lost_after_s=lost_after_s)
    svc = AnswerService(store, queue, FakeWaiter(queue), FakeRouter({"compare": "C"}), config,
                        has_knowledge_base=lambda tenant: True, on_recorded=recorded,
                        on_republished=lambda count: seen.append(("republished", count)))
    return svc, store, queue, seen


def soon(seconds: float = 5.0) -> float:
    return time.monotonic() + seconds


def stranded(svc: AnswerService, store: FakeStore, client_request_id: str | None = "order-1",
             age_s: float = 0.0) -> str:
    """A request its front door recorded and died before enqueueing, `age_s` ago."""
    progress = CallProgress()
    with pytest.raises(FrontDoorDied):
        asyncio.run(svc.answer(Answer(KEY, QUERY, client_request_id, soon()), progress))
    request_id = progress.request_id
    store.requests[request_id].updated_at -= age_s
    return request_id


def test_the_relay_publishes_a_request_recorded_but_never_enqueued_once_and_it_is_answered():
    svc, store, queue, seen = service(die_after_record=True)
    request_id = stranded(svc, store)
    assert store.requests[request_id].status is RequestStatus.QUEUED and queue.tasks == []
    assert asyncio.run(svc.relay_unpublished()) == []  # younger than unpublished_after_s
    time.sleep(0.06)
    assert asyncio.run(svc.relay_unpublished()) == [request_id] and seen[-1] == ("republished", 1)
    [task] = queue.tasks
    assert (task.request_id, task.tier, task.strategy, task.query) == (request_id, Tier.C, "no_retrieval", "compare")
    assert queue.done[request_id].wait(5)
    answered = asyncio.run(svc.get_result(GetResult(KEY, request_id), CallProgress()))
    assert answered.result.answer == "answer to compare"
    time.sleep(0.06)
    assert asyncio.run(svc.relay_unpublished()) == [] and len(queue.tasks) == 1


def test_small_talk_is_recorded_with_its_answer_at_once_so_a_front_door_that_died_left_nothing_to_relay():
    """Small talk is answered at admission and recorded in one write with its answer: a crash
    leaves all of it (a resend replays it) or none (a resend runs it anew)."""
    svc, store, queue, _ = service(die_after_record=True)
    progress = CallProgress()
    with pytest.raises(FrontDoorDied):
        asyncio.run(svc.answer(Answer(KEY, b"thanks a lot!", "thanks-1", soon()), progress))
    assert store.requests[progress.request_id].status is RequestStatus.DONE
    time.sleep(0.06)
    assert asyncio.run(svc.relay_unpublished()) == [] and queue.tasks == []
    resend, _, _, _ = service()
    resend.records, resend.queue, resend.waiter = store, queue, FakeWaiter(queue)
    again = asyncio.run(resend.answer(Answer(KEY, b"thanks a lot!", "thanks-1", soon()), CallProgress()))
    assert again.replayed and again.request_id == progress.request_id and again.result.answer


def test_an_answered_small_talk_request_is_left_alone_by_the_relay():
    svc, store, queue, _ = service()
    answered = asyncio.run(svc.answer(Answer(KEY, b"hello!", None, soon()), CallProgress()))
    assert store.requests[answered.request_id].status is RequestStatus.DONE
    time.sleep(0.06)
    assert asyncio.run(svc.relay_unpublished()) == [] and queue.tasks == []


def test_an_admitted_request_is_marked_published_and_the_relay_leaves_it_alone():
    svc, store, queue, _ = service(delay_s=1.0)
    progress = CallProgress()
    with pytest.raises(AnswerTimeoutError):  # still running: queued, its task on the queue
        asyncio.run(svc.answer(Answer(KEY, QUERY, None, soon(0.1)), progress))
    deadline = time.monotonic() + 2
    while store.requests[progress.request_id].enqueued_at is None:  # marked off the reply's path
        assert time.monotonic() < deadline, "never marked published"
        time.sleep(0.005)
    time.sleep(0.06)
    assert asyncio.run(svc.relay_unpublished()) == [] and len(queue.tasks) == 1


def test_the_relay_is_off_without_an_age():
    svc, store, queue, _ = service(unpublished_after_s=None, die_after_record=True)
    stranded(svc, store, age_s=3600)
    assert asyncio.run(svc.relay_unpublished()) == [] and queue.tasks == []


def test_a_resend_of_a_stranded_request_publishes_it_and_is_answered_under_its_request_id():
    svc, store, queue, _ = service(unpublished_after_s=None, die_after_record=True)
    request_id = stranded(svc, store, age_s=RESEND_PUBLISH_AFTER_S + 0.5)
    resend, _, _, _ = service()  # the front door started again
    resend.records, resend.queue, resend.waiter = store, queue, FakeWaiter(queue)
    progress = CallProgress()
    answered = asyncio.run(resend.answer(Answer(KEY, QUERY, "order-1", soon()), progress))
    assert answered.request_id == progress.request_id == request_id
    assert answered.result.answer == "answer to compare"
    assert [t.request_id for t in queue.tasks] == [request_id]  # published once, by the resend
    assert store.requests[request_id].enqueued_at is not None


def test_a_resend_while_its_first_admission_may_still_publish_waits_by_its_deadline():
    """Younger than `RESEND_PUBLISH_AFTER_S` the resend does not publish (its first call may be
    doing it): it waits, and its deadline ends the wait with the request id."""
    svc, store, queue, _ = service(unpublished_after_s=None, die_after_record=True)
    request_id = stranded(svc, store)
    resend, _, _, _ = service()
    resend.records, resend.queue, resend.waiter = store, queue, FakeWaiter(queue)
    progress = CallProgress()
    started = time.monotonic()
    with pytest.raises(AnswerTimeoutError, match=f"request {request_id} keeps running") as info:
        asyncio.run(resend.answer(Answer(KEY, QUERY, "order-1", soon(0.3)), progress))
    assert 0.25 < time.monotonic() - started < 0.8
    assert info.value.request_id == progress.request_id == request_id and queue.tasks == []


def test_a_replay_wait_ends_by_the_deadline_with_the_request_id():
    svc, store, queue, _ = service(delay_s=5.0)  # the worker takes longer than any deadline here
    first = CallProgress()
    with pytest.raises(AnswerTimeoutError):
        asyncio.run(svc.answer(Answer(KEY, QUERY, "order-2", soon(0.1)), first))
    progress = CallProgress()
    started = time.monotonic()
    with pytest.raises(AnswerTimeoutError) as info:
        asyncio.run(svc.answer(Answer(KEY, QUERY, "order-2", soon(0.3)), progress))
    assert 0.25 < time.monotonic() - started < 0.8
    assert info.value.request_id == progress.request_id == first.request_id
    assert len(queue.tasks) == 1  # a replay of a published request publishes nothing


def test_a_replay_whose_records_hang_still_ends_by_the_deadline():
    svc, store, queue, _ = service(delay_s=5.0)
    first = CallProgress()
    with pytest.raises(AnswerTimeoutError):
        asyncio.run(svc.answer(Answer(KEY, QUERY, "order-3", soon(0.1)), first))
    release = threading.Event()
    store.decision_for = lambda request_id: release.wait(10)  # the records stop answering
    progress = CallProgress()
    started = time.monotonic()
    try:
        with pytest.raises(AnswerTimeoutError) as info:
            asyncio.run(svc.answer(Answer(KEY, QUERY, "order-3", soon(0.3)), progress))
        assert 0.25 < time.monotonic() - started < 0.8
        assert info.value.request_id == first.request_id
    finally:
        release.set()


def test_over_grpc_a_replay_gets_deadline_exceeded_with_its_request_id_at_the_margin():
    """The same margin a new Answer gets (`deadline_margin_s`), never the client's own deadline."""
    harness = Harness(make_settings(deadline_margin_s=0.5), delay_s=30.0)
    try:
        ask = dict(client_request_id="order-4")
        first = status_of(harness.answer, "Which is older, X or Y?", timeout=1.5, **ask)
        assert first.code() is grpc.StatusCode.DEADLINE_EXCEEDED
        request_id = trailing(first.trailing_metadata())["x-request-id"]
        started = time.monotonic()
        replay = status_of(harness.answer, "Which is older, X or Y?", timeout=1.5, **ask)
        took = time.monotonic() - started
        assert replay.code() is grpc.StatusCode.DEADLINE_EXCEEDED, replay.details()
        assert trailing(replay.trailing_metadata())["x-request-id"] == request_id
        assert request_id in replay.details() and 0.8 < took < 1.4  # ~1.0 s: 1.5 - 0.5
    finally:
        harness.close()


def test_over_grpc_the_relay_answers_what_a_dead_front_door_left():
    harness = Harness(make_settings(unpublished_after_s=0.2, relay_every_s=0.1))
    try:
        request_id = "f" * 32
        harness.store.create_request(request_id, "acme", "order-5", "Which is older, X or Y?",
                                     decision=RoutingDecision(tier=Tier.C, fallback=True, reason="test",
                                                              strategy="decompose"))
        reply = harness.stub.GetResult  # polled as a client would
        deadline = time.monotonic() + 5
        while True:
            try:
                answered = reply(pb2.GetResultRequest(request_id=request_id), metadata=AUTH, timeout=2)
                break
            except grpc.RpcError as exc:
                assert exc.code() is grpc.StatusCode.FAILED_PRECONDITION, exc.details()
                assert time.monotonic() < deadline, "the relay never published it"
                time.sleep(0.05)
        assert answered.request_id == request_id and answered.answer
        assert harness.metrics.registry.get_sample_value("arag_requests_republished_total") == 1.0
    finally:
        harness.close()


def test_a_step_before_the_request_is_recorded_that_hangs_ends_by_the_deadline_too():
    svc, store, queue, _ = service()
    release = threading.Event()
    store.principal_for_key = lambda key: release.wait(10)  # the records stop answering
    progress = CallProgress()
    started = time.monotonic()
    try:
        with pytest.raises(AnswerTimeoutError, match="the request was not recorded; send it again"):
            asyncio.run(svc.answer(Answer(KEY, QUERY, "order-6", soon(0.3)), progress))
        assert 0.25 < time.monotonic() - started < 0.8
        assert progress.request_id is None and store.requests == {} and queue.tasks == []
    finally:
        release.set()


def test_a_published_message_the_broker_holds_nowhere_is_published_again_once():
    """A worker host took the message off its queue and died before recording it: the records
    say published and never delivered, the broker holds it nowhere."""
    svc, store, queue, seen = service(delay_s=60.0, lost_after_s=0.05)
    progress = CallProgress()
    with pytest.raises(AnswerTimeoutError):
        asyncio.run(svc.answer(Answer(KEY, QUERY, "lost-1", time.monotonic() + 0.3), progress))
    request_id = progress.request_id
    time.sleep(0.06)
    assert asyncio.run(svc.republish_lost()) == []  # still waiting on its queue
    queue.lost.add(request_id)
    assert asyncio.run(svc.republish_lost()) == [request_id] and seen[-1] == ("republished", 1)
    assert [t.request_id for t in queue.tasks] == [request_id, request_id]
    assert asyncio.run(svc.republish_lost()) == []  # published just now
    queue.tells = False  # a broker that cannot tell: nothing is published on a guess
    time.sleep(0.06)
    assert asyncio.run(svc.republish_lost()) == [] and len(queue.tasks) == 2


def test_a_message_a_worker_began_is_never_looked_for():
    svc, store, queue, _ = service(delay_s=60.0, lost_after_s=0.05)
    progress = CallProgress()
    with pytest.raises(AnswerTimeoutError):
        asyncio.run(svc.answer(Answer(KEY, QUERY, "begun-1", time.monotonic() + 0.3), progress))
    assert store.begin_run(progress.request_id) == 1
    queue.lost.add(progress.request_id)  # acknowledged and gone from the broker, as a run in progress may be
    time.sleep(0.06)
    assert asyncio.run(svc.republish_lost()) == [] and len(queue.tasks) == 1
