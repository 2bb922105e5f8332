"""The `adaptive_rag.answer` Celery task: the Celery edge of `adaptive_rag.serving.answering`.

The task takes an `AnswerTask` and returns an `AnswerResult` (Celery validates and dumps them:
`pydantic=True`). What it adds to the use case is Celery's: the attempt count, retries with
exponential backoff for transient failures, the soft time limit's exception, and recording the
failures the task body never sees (hard time limit, a pool process lost too often). Every run
also feeds the pool's Prometheus metrics (`workers.metrics`).
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, field
from typing import Any

import structlog
from cachetools import LRUCache, TTLCache
from celery import Task
from celery.exceptions import Ignore, SoftTimeLimitExceeded
from celery.signals import task_failure, task_retry, worker_process_init
from celery.utils.time import get_exponential_backoff_interval

from adaptive_rag.contracts import ANSWER_TASK, AnswerResult, AnswerStyle, AnswerTask
from adaptive_rag.knowledge.documents import KnowledgeIndex
from adaptive_rag.ports import LLM, Retriever
from adaptive_rag.serving.answering import (
    Delivery, NotRunnable, RecordsUnavailable, RetryLater, answer_task, failure, write_once,
)
from adaptive_rag.settings import Settings
from adaptive_rag.storage import KnowledgeRecords, RecordStore, make_engine
from adaptive_rag.strategies.abstention import Abstention
from workers.celery_app import app, app_settings
from workers.failures import dead_task_error
from workers.metrics import worker_metrics

log = structlog.get_logger("workers.tasks")
# The records database away once a task's retries are spent (`RecordsUnavailable`): the task runs
# again every RECORDS_RETRY_S until RECORDS_OUTAGE_S after it was enqueued, beyond
# `task_max_retries`: nothing else can record its answer (a restart or failover of the database
# takes seconds to minutes), and giving up leaves the request `running` with no result, forever.
RECORDS_RETRY_S = 2.0
RECORDS_OUTAGE_S = 600.0
# How long a worker keeps a tenant's abstention thresholds before reading them again: a new
# import's threshold, or an operator's override, holds within this time.
ABSTENTION_TTL_S = 5.0


@dataclass
class WorkerResources:
    """What one worker process loads once and reuses for every task it runs.

    The LLM and each tenant's retriever load on first use and are kept only once loaded, so a
    failed load (a knowledge base not there yet) is tried again by the next attempt instead of
    being cached. At most `kb_open_retrievers` tenants' retrievers stay open (least recently used
    closed first); each follows its tenant's later imports and rebuilds by itself. Each tenant's
    abstention thresholds and answer style are read from the records and kept `ABSTENTION_TTL_S`.
    """

    settings: Settings
    store: RecordStore
    pid: int = field(default_factory=os.getpid)
    _knowledge: KnowledgeIndex | None = field(default=None, repr=False)
    _retrievers: LRUCache | None = field(default=None, repr=False)
    _llm: LLM | None = field(default=None, repr=False)
    _abstentions: TTLCache | None = field(default=None, repr=False)
    _kb_records: KnowledgeRecords | None = field(default=None, repr=False)
    _styles: TTLCache | None = field(default=None, repr=False)

    def retriever(self, tenant: str) -> Retriever:
        if self._retrievers is None:
            self._retrievers = LRUCache(maxsize=self.settings.kb_open_retrievers)
        found = self._retrievers.get(tenant)
        if found is None:
            if self._knowledge is None:
                from adaptive_rag.knowledge.indexes import open_knowledge_index

                self._knowledge = open_knowledge_index(self.settings)
            found = self._retrievers[tenant] = self._knowledge.retriever(tenant)
        return found

    def abstention(self, tenant: str) -> Abstention:
        """The thresholds `tenant`'s queries abstain below: the relevance threshold in effect for
        its knowledge base (`knowledge.calibration.threshold_in_effect`) and the raw BM25 floor."""
        if self._abstentions is None:
            self._abstentions = TTLCache(maxsize=self.settings.kb_open_retrievers, ttl=ABSTENTION_TTL_S)
            self._styles = TTLCache(maxsize=self.settings.kb_open_retrievers, ttl=ABSTENTION_TTL_S)
        found = self._abstentions.get(tenant)
        if found is None:
            from adaptive_rag.knowledge.calibration import threshold_in_effect

            if self._kb_records is None:
                self._kb_records = KnowledgeRecords(self.store.engine)
            state = self._kb_records.state(tenant)
            in_effect = threshold_in_effect(state.abstain_threshold if state else None,
                                            state.abstain_override if state else None,
                                            self.settings.abstain_min_relevance)
            found = self._abstentions[tenant] = Abstention(min_relevance=in_effect.value,
                                                           min_score=self.settings.abstain_min_score)
            self._styles[tenant] = (state.answer_style if state else None) or self.settings.answer_style
        return found

    def answer_style(self, tenant: str) -> AnswerStyle:
        """How `tenant`'s answers read: its own style (`arag kb style`), else the deployment's;
        read with its thresholds and kept as long."""
        if self._styles is None or tenant not in self._styles:
            self.abstention(tenant)
        assert self._styles is not None
        return self._styles.get(tenant, self.settings.answer_style)

    def llm(self) -> LLM:
        if self._llm is None:
            from adaptive_rag.llm import build_llm

            self._llm = build_llm(self.settings)
        return self._llm


_resources: WorkerResources | None = None


def resources() -> WorkerResources:
    """This process's resources, made in this process.

    A pool child forked from a parent that already had resources (the parent records failures
    too) drops the inherited database pool without closing it: its sockets belong to the parent.
    """
    global _resources
    if _resources is not None and _resources.pid != os.getpid():
        _resources.store.engine.dispose(close=False)
        _resources = None
    if _resources is None:
        from adaptive_rag.evidence.graphs import shared_graphs

        settings = Settings()
        _resources = WorkerResources(settings, RecordStore(make_engine(settings.database_url)))
        # a request never waits for its knowledge base's entity graph: built in the background
        shared_graphs(settings.evidence_graphs, background=True)
    return _resources


@worker_process_init.connect
def _preload(**_: Any) -> None:
    """Load the LLM and the evidence scorer when a pool process starts, not on its first query
    (tenants' retrievers open on their first query)."""
    try:
        resources().llm()
    except Exception as exc:  # noqa: BLE001 - the task reports it, with retries, when it runs
        log.warning("worker.preload_failed", error=f"{type(exc).__name__}: {exc}")
    try:
        if resources().settings.evidence_tokens:
            from adaptive_rag.evidence.sentences import warm

            warm()
    except Exception as exc:  # noqa: BLE001 - the first answer then pays the import
        log.warning("worker.preload_failed", error=f"{type(exc).__name__}: {exc}")


def _worker_name(task: Task | None) -> str:
    hostname = getattr(getattr(task, "request", None), "hostname", None)
    return f"{hostname or 'worker'}/{os.getpid()}"


_settings = app_settings(app)


@app.task(
    bind=True, name=ANSWER_TASK, pydantic=True, acks_late=True, reject_on_worker_lost=True,
    # A pool process lost mid-task (killed, out of memory, crashed in native code): send the task
    # again, at most `task_max_retries` times, so a message that kills every worker ends as a
    # recorded error (see `_record_failure`) instead of crashing pools forever. A run that kills
    # the whole worker (its main process) is capped by the deliveries counted in the records
    # (`max_deliveries`, see `answer_task`).
    retry_on_worker_lost=True, max_retries=_settings.task_max_retries,
    default_retry_delay=_settings.task_retry_backoff_s,
    # Celery formats the returned result for its success log line (switched off, see
    # `celery_app`) on every task: 137 us at its default 1,024 characters, 16 us at 64.
    resultrepr_maxsize=64,
)
def answer(self: Task, task: AnswerTask) -> AnswerResult:
    """Answer `task` with its strategy; returns the result stored for it."""
    delivered_again = bool((self.request.delivery_info or {}).get("redelivered"))
    retries = self.request.retries
    delivery = Delivery(
        worker=_worker_name(self), attempt=retries + 1 + delivered_again,
        may_retry=retries < _settings.task_max_retries, retries=retries,
    )
    res = resources()
    started = time.perf_counter()
    try:
        result = answer_task(task, res.store, res, delivery, time_limit_errors=(SoftTimeLimitExceeded,),
                             max_deliveries=_settings.max_deliveries)
        worker_metrics().task_done(result, time.perf_counter() - started)
        return result
    except NotRunnable as exc:  # its request never ran and was not resent: acknowledged, no result
        raise Ignore() from exc
    except RecordsUnavailable as exc:
        if not records_retry_allowed(task):
            raise
        raise self.retry(exc=exc, countdown=RECORDS_RETRY_S, max_retries=retries + 1) from exc
    except RetryLater as exc:
        countdown = get_exponential_backoff_interval(
            factor=_settings.task_retry_backoff_s, retries=retries,
            maximum=_settings.task_retry_max_backoff_s,
            full_jitter=False,
        )
        raise self.retry(exc=exc, countdown=countdown, max_retries=_settings.task_max_retries) from exc


@task_retry.connect(sender=answer)
def _count_retry(request: Any = None, reason: BaseException | None = None, **_: Any) -> None:
    """A run sent back to its queue (sent only when the retry really happened)."""
    task = ((getattr(request, "kwargs", None) or {}).get("task")) or {}
    cause = "records" if isinstance(getattr(reason, "exc", reason), RecordsUnavailable) else "transient"
    worker_metrics().task_retried(str(task.get("tier", "?")), str(task.get("kind", "?")), cause)


def records_retry_allowed(task: AnswerTask, now: float | None = None) -> bool:
    """Whether a run that could not reach the records database may be tried again."""
    return (time.time() if now is None else now) - task.enqueued_at < RECORDS_OUTAGE_S


@task_failure.connect(sender=answer)
def _record_failure(
    sender: Task | None = None, task_id: str | None = None, exception: BaseException | None = None,
    kwargs: dict[str, Any] | None = None, **_: Any,
) -> None:
    """Failures the task body could not record itself become error results.

    Celery sends this from the worker's main process when a pool process hit the hard time limit
    or was lost more often than `task_max_retries` allows: the client then reads an error result
    instead of waiting on a request that stays `running` forever.
    """
    try:
        task = AnswerTask.model_validate((kwargs or {}).get("task"))
    except ValueError:
        log.error("task.failure_unrecordable", task_id=task_id, kwargs=str(kwargs)[:500])
        return
    code, _ = dead_task_error(type(exception).__name__)
    detail = f"{type(exception).__name__}: {exception}"
    worker_metrics().task_failed(task.tier.value, task.kind.value, code.value)
    retries = getattr(getattr(sender, "request", None), "retries", 0) or 0
    try:
        write_once(resources().store, failure(task, code, detail),
                   Delivery(worker=_worker_name(sender), attempt=retries + 1, may_retry=False))
        log.error("task.failure_recorded", request_id=task.request_id, task_id=task_id,
                  error_code=code.value, error=detail)
    except Exception as exc:  # noqa: BLE001 - the database itself is down: nothing more to do
        log.error("task.failure_not_recorded", request_id=task.request_id, error=str(exc))
