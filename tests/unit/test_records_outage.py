"""A worker's run while the records database is away (`answer_task` over fake ports): once its
retries are spent it must neither record an error nor end without a result row (the request would
stay `running` forever and the client would read INTERNAL); it asks to run again later."""

from __future__ import annotations

import time

import pytest
from fakes import FakeLLM, FakeRetriever, make_passages
from frontdoor_fakes import FakeStore

from adaptive_rag.contracts import AnswerStyle, AnswerTask, ErrorCode, RequestStatus, Tier
from adaptive_rag.errors import DatabaseUnavailableError, RetrieverUnavailableError
from adaptive_rag.serving.answering import Delivery, RecordsUnavailable, RetryLater, answer_task
from adaptive_rag.settings import Settings
from adaptive_rag.strategies import Abstention


def db_down() -> DatabaseUnavailableError:
    """What the records adapter raises for its driver's "connection refused" (`test_records`)."""
    return DatabaseUnavailableError("the records database is unreachable (OperationalError)")


class FlakyStore(FakeStore):
    """The fake records, with the database switched off and on."""

    def __init__(self) -> None:
        super().__init__()
        self.down = False

    def get_result(self, *args, **kwargs):
        if self.down:
            raise db_down()
        return super().get_result(*args, **kwargs)

    def set_status(self, *args, **kwargs):
        if self.down:
            raise db_down()
        return super().set_status(*args, **kwargs)

    def begin_run(self, *args, **kwargs):
        if self.down or getattr(self, "down_at_begin", False):
            raise db_down()
        return super().begin_run(*args, **kwargs)

    def save_result(self, *args, **kwargs):
        if self.down:
            raise db_down()
        return super().save_result(*args, **kwargs)


class Resources:
    def __init__(self, retriever) -> None:
        self.settings = Settings(_env_file=None, top_k=2)
        self._retriever = retriever
        self._llm = FakeLLM(lambda prompt: "Lumora Lighting")

    def retriever(self, tenant: str):
        if isinstance(self._retriever, Exception):
            raise self._retriever
        return self._retriever

    def abstention(self, tenant: str) -> Abstention:
        return Abstention()

    def answer_style(self, tenant: str) -> AnswerStyle:
        return AnswerStyle.SHORT

    def llm(self):
        return self._llm


def task_in(store: FakeStore) -> AnswerTask:
    store.create_request("r1", "acme", None, "Who makes Lumora lamps?")
    return AnswerTask(request_id="r1", tenant="acme", query="Who makes Lumora lamps?", tier=Tier.B,
                      strategy="single_step", enqueued_at=time.time())


def test_records_away_after_the_last_retry_asks_to_run_again_instead_of_failing() -> None:
    store = FlakyStore()
    task = task_in(store)
    store.down = True
    with pytest.raises(RecordsUnavailable):
        answer_task(task, store, Resources(FakeRetriever(make_passages(3))), Delivery("w", 4, may_retry=False))
    store.down = False
    assert store.results == {}
    result = answer_task(task, store, Resources(FakeRetriever(make_passages(3))), Delivery("w", 5, may_retry=False))
    assert result.ok and store.requests["r1"].status is RequestStatus.DONE


def test_an_error_that_cannot_be_recorded_is_not_lost_either() -> None:
    """The retriever is away and so is the database when its error would be written."""
    store = FlakyStore()
    task = task_in(store)

    class DownWhenRetrieving:
        def search(self, *args, **kwargs):
            store.down = True
            raise RetrieverUnavailableError("OpenSearch is unreachable")

    with pytest.raises(RecordsUnavailable, match="dependency_unavailable not recorded"):
        answer_task(task, store, Resources(DownWhenRetrieving()), Delivery("w", 4, may_retry=False))
    assert store.results == {}


def test_while_retries_are_left_a_records_outage_is_an_ordinary_retry() -> None:
    store = FlakyStore()
    task = task_in(store)
    store.down = True
    with pytest.raises(RetryLater) as caught:
        answer_task(task, store, Resources(FakeRetriever(make_passages(3))), Delivery("w", 1, may_retry=True))
    assert type(caught.value) is RetryLater


def test_other_dependencies_still_end_as_recorded_errors() -> None:
    store = FlakyStore()
    task = task_in(store)
    result = answer_task(task, store, Resources(RetrieverUnavailableError("OpenSearch is unreachable")),
                         Delivery("w", 4, may_retry=False))
    assert result.error_code is ErrorCode.DEPENDENCY_UNAVAILABLE


def test_the_worker_retries_a_records_outage_for_a_bounded_time() -> None:
    tasks = pytest.importorskip("workers.tasks")
    task = AnswerTask(request_id="r1", tenant="acme", query="q", tier=Tier.B, strategy="single_step",
                      enqueued_at=1000.0)
    assert tasks.records_retry_allowed(task, now=1000.0 + tasks.RECORDS_OUTAGE_S - 1)
    assert not tasks.records_retry_allowed(task, now=1000.0 + tasks.RECORDS_OUTAGE_S + 1)


def test_the_default_retries_ride_out_a_dependency_restart_of_30_s_and_retry_soon_after() -> None:
    from celery.utils.time import get_exponential_backoff_interval

    from workers.settings import WorkerSettings

    settings = WorkerSettings(_env_file=None)
    waits = [get_exponential_backoff_interval(factor=settings.task_retry_backoff_s, retries=n,
                                              maximum=settings.task_retry_max_backoff_s, full_jitter=False)
             for n in range(settings.task_max_retries)]
    assert sum(waits) >= 30.0
    assert max(waits) <= 5.0  # the first try after the dependency is back comes within seconds


def test_a_run_that_cannot_count_its_delivery_does_not_run_and_is_not_counted() -> None:
    """The database goes away between the result check and the delivery count."""
    store = FlakyStore()
    task = task_in(store)
    store.down_at_begin = True
    with pytest.raises(RetryLater):
        answer_task(task, store, Resources(FakeRetriever(make_passages(3))), Delivery("w", 1, may_retry=True))
    with pytest.raises(RecordsUnavailable):
        answer_task(task, store, Resources(FakeRetriever(make_passages(3))), Delivery("w", 4, may_retry=False))
    assert store.results == {} and store.requests["r1"].deliveries == 0
    assert store.requests["r1"].status is RequestStatus.QUEUED
