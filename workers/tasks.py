"""The `adaptive_rag.answer` task: run one tier's strategy for one request and record the result.

Guarantees the task gives on top of the broker's at-least-once delivery:
- one result row per (request, kind, tier): a second delivery returns the stored row, and two
  runs racing each other both end with the row the first writer stored;
- transient failures (retriever or LLM unreachable, index missing, database hiccup) are retried
  with exponential backoff; after the last retry, and for any other failure, an error result is
  recorded and returned, so the client always gets an answer or an error, never silence.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, field
from typing import Any

import structlog
from celery import Task
from celery.exceptions import SoftTimeLimitExceeded, TimeLimitExceeded
from celery.signals import task_failure, worker_process_init
from celery.utils.time import get_exponential_backoff_interval
from sqlalchemy.exc import InterfaceError, OperationalError

from adaptive_rag.domain import StrategyResult
from adaptive_rag.errors import IndexNotFoundError, LLMUnavailableError, RetrieverUnavailableError
from adaptive_rag.ports import LLM, Retriever
from adaptive_rag.settings import Settings
from adaptive_rag.storage import RecordStore, make_engine
from adaptive_rag.storage.records import ResultView
from adaptive_rag.strategies import build_strategy
from workers.celery_app import app, app_settings

log = structlog.get_logger("workers.tasks")

TASK_NAME = "adaptive_rag.answer"
# Failures that may pass: the same task can succeed a little later.
TRANSIENT = (
    RetrieverUnavailableError, LLMUnavailableError, IndexNotFoundError, OperationalError,
    InterfaceError, ConnectionError, TimeoutError,
)
MAX_BACKOFF_S = 60.0


@dataclass
class WorkerResources:
    """What one worker process loads once and reuses for every task it runs.

    The retriever and the LLM load on first use and are kept only once loaded, so a failed load
    (index not there yet) is tried again by the next attempt instead of being cached.
    """

    settings: Settings
    store: RecordStore
    pid: int = field(default_factory=os.getpid)
    _retriever: Retriever | None = field(default=None, repr=False)
    _llm: LLM | None = field(default=None, repr=False)

    def retriever(self) -> Retriever:
        if self._retriever is None:
            from adaptive_rag.retrieval import open_retriever

            self._retriever = open_retriever(self.settings)
        return self._retriever

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
        settings = Settings()
        _resources = WorkerResources(settings, RecordStore(make_engine(settings.database_url)))
    return _resources


@worker_process_init.connect
def _preload(**_: Any) -> None:
    """Load the LLM and open the index when a pool process starts, not on its first query."""
    try:
        res = resources()
        res.llm()
        res.retriever()
    except Exception as exc:  # noqa: BLE001 - the task reports it, with retries, when it runs
        log.warning("worker.preload_failed", error=f"{type(exc).__name__}: {exc}")


def _sources(result: StrategyResult) -> list[dict[str, Any]]:
    return [{"id": p.id, "title": p.title, "score": float(p.score)} for p in result.passages]


def _timings_ms(result: StrategyResult | None, queue_wait_s: float, elapsed_s: float) -> dict[str, float]:
    phases = result.timings if result else {}
    return {
        "queue_wait_ms": round(max(queue_wait_s, 0.0) * 1000, 3),
        "strategy_ms": round(phases.get("total", elapsed_s) * 1000, 3),
        "retrieve_ms": round(phases.get("retrieve", 0.0) * 1000, 3),
        "generate_ms": round(phases.get("generate", 0.0) * 1000, 3),
    }


def _stored(store: RecordStore, request_id: str, kind: str, tier: str) -> ResultView | None:
    if kind == "primary":
        return store.get_result(request_id)
    return next((r for r in store.shadow_results(request_id) if r.tier == tier), None)


_settings = app_settings(app)


@app.task(
    bind=True, name=TASK_NAME, acks_late=True, reject_on_worker_lost=True,
    # A pool process lost mid-task (killed, out of memory, crashed in native code): send the task
    # again, at most `task_max_retries` times, so a message that kills every worker ends as a
    # recorded error (see `_record_failure`) instead of crashing pools forever.
    retry_on_worker_lost=True, max_retries=_settings.task_max_retries,
    default_retry_delay=_settings.task_retry_backoff_s,
)
def answer(
    self: Task, request_id: str, query: str, tier: str, strategy: str, kind: str = "primary",
    enqueued_at: float | None = None,
) -> dict[str, Any]:
    """Answer `query` with `strategy` for tier `tier`; returns the stored result as a dict."""
    started = time.time()
    res = resources()
    store = res.store
    worker = f"{self.request.hostname or 'worker'}/{os.getpid()}"
    delivery = self.request.delivery_info or {}
    attempts = self.request.retries + 1 + (1 if delivery.get("redelivered") else 0)
    bound = log.bind(request_id=request_id, kind=kind, tier=tier, strategy=strategy,
                     attempt=attempts, worker=worker)

    def record(**outcome: Any) -> dict[str, Any]:
        """Write the result once; whoever wrote first decides what every delivery returns."""
        store.save_result(request_id, kind, tier, strategy, worker=worker, attempts=attempts,
                          **outcome)
        stored = _stored(store, request_id, kind, tier)
        if stored is not None:
            return stored.as_payload()
        return {"request_id": request_id, "kind": kind, "tier": tier, "strategy": strategy,
                "error": None, "error_code": None, **outcome}

    def failed(code: str, exc: BaseException) -> dict[str, Any]:
        bound.error("task.failed", error_code=code, error=f"{type(exc).__name__}: {exc}")
        return record(answer=None, steps=0, sources=[], error=f"{type(exc).__name__}: {exc}",
                      error_code=code, timings=_timings_ms(None, started - (enqueued_at or started),
                                                           time.time() - started))

    try:
        existing = _stored(store, request_id, kind, tier)
        if existing is not None:  # a second delivery of a task that already finished
            bound.info("task.already_done")
            return existing.as_payload()
        if kind == "primary":
            store.set_status(request_id, "running")
        bound.info("task.started")
        retriever = res.retriever() if strategy != "no_retrieval" else None
        runner = build_strategy(strategy, retriever, res.llm(), res.settings)  # type: ignore[arg-type]
        result = runner.run(query)
        payload = record(
            answer=result.answer, steps=result.steps, sources=_sources(result),
            timings=_timings_ms(result, started - (enqueued_at or started), time.time() - started),
        )
        bound.info("task.done", steps=result.steps, ms=payload["timings"].get("strategy_ms"))
        return payload
    except SoftTimeLimitExceeded as exc:
        return failed("DEADLINE_EXCEEDED", exc)
    except TRANSIENT as exc:
        max_retries = res.settings.task_max_retries
        if self.request.retries < max_retries:
            countdown = get_exponential_backoff_interval(
                factor=res.settings.task_retry_backoff_s, retries=self.request.retries,
                maximum=MAX_BACKOFF_S, full_jitter=False,
            )
            bound.warning("task.retry", error=f"{type(exc).__name__}: {exc}", countdown=countdown)
            raise self.retry(exc=exc, countdown=countdown, max_retries=max_retries) from exc
        return failed("UNAVAILABLE", exc)
    except Exception as exc:  # noqa: BLE001 - a bug or bad input: recorded, not retried
        return failed("INTERNAL", exc)


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
    kwargs = kwargs or {}
    request_id = kwargs.get("request_id")
    if not request_id:
        return
    code = "DEADLINE_EXCEEDED" if isinstance(exception, TimeLimitExceeded) else "INTERNAL"
    try:
        resources().store.save_result(
            request_id, kwargs.get("kind", "primary"), kwargs.get("tier", "?"),
            kwargs.get("strategy", "?"), answer=None, steps=0, sources=[], timings={},
            worker=f"{getattr(sender.request, 'hostname', None) or 'worker'}/{os.getpid()}"
            if sender else "worker",
            attempts=(getattr(sender.request, "retries", 0) or 0) + 1 if sender else 1,
            error=f"{type(exception).__name__}: {exception}", error_code=code,
        )
        log.error("task.failure_recorded", request_id=request_id, task_id=task_id, error_code=code,
                  error=f"{type(exception).__name__}: {exception}")
    except Exception as exc:  # noqa: BLE001 - the database itself is down: nothing more to do
        log.error("task.failure_not_recorded", request_id=request_id, error=str(exc))
