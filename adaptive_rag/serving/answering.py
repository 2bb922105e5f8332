"""What a worker does with one `AnswerTask`: run the tier's strategy, write the result once, return
it (the queue's result backend then publishes it to whoever waits).

Guarantees on top of the queue's at-least-once delivery:
- one result row per (request, kind, tier): a second delivery returns the stored result, and two
  runs racing each other both end with the result the first writer stored;
- transient failures (retriever or LLM unreachable, index missing, database hiccup) raise
  `RetryLater` while the delivery may still retry; after that, and for any other failure, an
  error result is recorded and returned, so the client always gets an answer or an error;
- the records database itself unreachable once the retries are spent raises `RecordsUnavailable`
  instead: neither an answer nor an error can be recorded then, and a run that ends without a
  result row would leave its request `running` forever (the edge tries it again later);
- a primary task whose request is not in flight (it never ran: `expired` or `rejected`, and its
  client did not resend it) is not run: `NotRunnable`, the edge acknowledges it and stores nothing;
- every delivery that begins a run is counted in the records (`Records.begin_run`); a message
  delivered more than `max_deliveries` times (its retries not counted: each is a new message) kept
  killing its worker before it could finish, and records an `internal` error instead of running.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

import structlog

from adaptive_rag.contracts import (
    AnswerResult, AnswerStyle, AnswerTask, ErrorCode, ResultKind, Source, StrategyName, Timings,
)
from adaptive_rag.domain import StrategyResult
from adaptive_rag.errors import (
    DatabaseUnavailableError, IndexNotFoundError, LLMUnavailableError, RequestNotFoundError,
    RetrieverUnavailableError,
)
from adaptive_rag.ports import LLM, Retriever
from adaptive_rag.serving.ports import Records
from adaptive_rag.settings import Settings
from adaptive_rag.strategies import Abstention, build_strategy, uses_retrieval
from adaptive_rag.strategies.base import run_metered
from adaptive_rag.strategies.small_talk import SmallTalkReply
from adaptive_rag.tracing import annotate, span

LOG = structlog.get_logger("serving.answering")
# A strategy that ran but produced no text (a small model can stop at once on a long or odd
# question): the reply says so instead of answering OK with an empty string.
EMPTY_ANSWER = "the model produced no answer to this question"
# Failures that may pass: the same task can succeed a little later.
TRANSIENT: tuple[type[BaseException], ...] = (
    RetrieverUnavailableError, LLMUnavailableError, IndexNotFoundError, DatabaseUnavailableError,
    ConnectionError, TimeoutError,
)


class StrategyResources(Protocol):
    """What running a strategy needs; loaded once per worker process, on first use."""

    settings: Settings

    def retriever(self, tenant: str) -> Retriever:
        """A retriever over `tenant`'s knowledge base only."""
        ...

    def abstention(self, tenant: str) -> Abstention:
        """The thresholds below which `tenant`'s retrieving strategies abstain."""
        ...

    def answer_style(self, tenant: str) -> AnswerStyle:
        """How `tenant`'s retrieving strategies answer (its own style, else the deployment's)."""
        ...

    def llm(self) -> LLM: ...


@dataclass(frozen=True)
class Delivery:
    """How this run of a task was delivered: by whom, which attempt, whether a retry is left, and
    how many retries (each a new message, each beginning its run once) came before this message."""

    worker: str
    attempt: int
    may_retry: bool
    retries: int = 0


class RetryLater(Exception):
    """A transient failure the queue should retry (the edge chooses the backoff)."""


class RecordsUnavailable(RetryLater):
    """The records database does not answer, so this run can record nothing, not even its error:
    it must run again once the database is back, whatever retries are left."""


class NotRunnable(Exception):
    """The task's request is not in flight: it never ran (`expired`, `rejected`) and was not
    admitted again, or it is not its tenant's (no such request for the task's tenant). Nothing
    runs it and nothing is recorded; a resend of the request runs it."""


# The records database's own failures (connection refused, server gone): see `RecordsUnavailable`.
RECORDS_DOWN: tuple[type[BaseException], ...] = (DatabaseUnavailableError,)


def answer_task(
    task: AnswerTask, records: Records, resources: StrategyResources, delivery: Delivery,
    time_limit_errors: tuple[type[BaseException], ...] = (),
    clock: Callable[[], float] = time.time,
    max_deliveries: int | None = None,
) -> AnswerResult:
    """Answer `task`, record the result once, and return the result that was stored.

    `time_limit_errors`: the exceptions the queue raises inside a run that hit its soft time
    limit (recorded as `ErrorCode.TIME_LIMIT`). `max_deliveries`: how often one message may
    begin its run (None: no cap); see the module.
    """
    started = clock()
    annotate(**{"arag.request_id": task.request_id, "arag.tier": task.tier.value,
                "arag.kind": task.kind.value, "arag.attempt": delivery.attempt})
    log = LOG.bind(request_id=task.request_id, kind=task.kind.value, tier=task.tier.value,
                   strategy=task.strategy, attempt=delivery.attempt, worker=delivery.worker)

    def failed(code: ErrorCode, exc: BaseException, detail: str | None = None) -> AnswerResult:
        log.error("task.failed", error_code=code.value, error=_describe(exc))
        try:
            return write_once(records, failure(task, code, detail or _describe(exc), started, clock()), delivery)
        except RECORDS_DOWN as down:
            log.warning("task.unrecordable", error=_describe(down))
            raise RecordsUnavailable(f"{code.value} not recorded: {_describe(down)}") from down

    try:
        with span("records.claim"):
            # A primary run that already finished is no longer in flight, so `begin_run` refuses
            # it and the stored result is read below: one round trip for a first delivery. A
            # shadow run has no such state; its result is looked up first.
            existing = (records.get_result(task.request_id, task.kind, task.tier)
                        if task.kind is ResultKind.SHADOW else None)
            if existing is not None:  # a second delivery of a task that already finished
                log.info("task.already_done")
                return existing
            try:  # counted on the task's own tenant's request only
                deliveries = records.begin_run(task.request_id, task.kind, tenant=task.tenant)
            except RequestNotFoundError as exc:  # nothing to run, and no result row to write
                log.error("task.no_such_request", tenant=task.tenant)
                raise NotRunnable(f"request {task.request_id} of tenant {task.tenant}: not recorded") from exc
            if deliveries is None:  # not in flight: finished just now, or never ran
                stored = records.get_result(task.request_id, task.kind, task.tier)
                if stored is not None:
                    log.info("task.already_done")
                    return stored
                view = records.get_request(task.request_id)
                status = view.status.value if view is not None else "unknown"
                log.warning("task.not_runnable", status=status)
                raise NotRunnable(f"request {task.request_id} is {status}: not run")
            runs = deliveries - delivery.retries  # deliveries of this message that began its run
            if max_deliveries is not None and runs > max_deliveries:
                killed = runs - 1
                log.error("task.redelivery_cap", deliveries=runs, max_deliveries=max_deliveries)
                return write_once(records, failure(
                    task, ErrorCode.INTERNAL,
                    f"the task killed its worker {killed} time{'s' if killed != 1 else ''} "
                    "before it could finish; not run again", started, clock(),
                ), delivery)
        log.info("task.started")
        with span("resources"):  # the tenant's retriever and the LLM, opened on first use
            retrieves = uses_retrieval(task.strategy)
            retriever = resources.retriever(task.tenant) if retrieves else None
            abstention = resources.abstention(task.tenant) if retrieves else None
            style = resources.answer_style(task.tenant) if retrieves else AnswerStyle.SHORT
            runner = build_strategy(task.strategy, retriever, resources.llm(), resources.settings,  # type: ignore[arg-type]
                                    abstention, style)
        outcome = run_metered(runner, task.query)
        answerable, reason = outcome.answerable, outcome.abstain_reason or None
        if answerable and not (outcome.answer or "").strip():
            answerable, reason = False, EMPTY_ANSWER
            log.warning("task.empty_answer", query_chars=len(task.query))
        result = _result(task, outcome, answerable, reason, started, clock(),
                         cost=resources.settings.llm_cost(outcome.usage.prompt_tokens,
                                                          outcome.usage.completion_tokens))
        with span("records.write"):
            stored = write_once(records, result, delivery)
        log.info("task.done", steps=outcome.steps, ms=stored.timings.strategy_ms,
                 prompt_tokens=result.prompt_tokens, completion_tokens=result.completion_tokens)
        return stored
    except NotRunnable:
        raise
    except time_limit_errors as exc:
        # the client reads this: what happened, not the worker's exception class
        return failed(ErrorCode.TIME_LIMIT, exc, f"the {task.strategy} strategy did not finish within its time limit")
    except TRANSIENT as exc:
        if delivery.may_retry:
            log.warning("task.retry", error=_describe(exc))
            raise RetryLater(_describe(exc)) from exc
        if isinstance(exc, RECORDS_DOWN):  # the database this run must write to: wait for it
            log.warning("task.records_unavailable", error=_describe(exc))
            raise RecordsUnavailable(_describe(exc)) from exc
        return failed(ErrorCode.DEPENDENCY_UNAVAILABLE, exc)
    except Exception as exc:  # noqa: BLE001 - a bug or bad input: recorded, not retried
        return failed(ErrorCode.INTERNAL, exc)


def canned_answer(task: AnswerTask, clock: Callable[[], float] = time.time) -> AnswerResult:
    """The result of a small-talk `task`, run where it was admitted with no worker: its reply
    needs neither a retriever nor the LLM, and a queue would only add its wait (behind the
    tier's LLM work). The caller records it with its request in one write
    (`Records.record_answered`)."""
    if task.strategy != StrategyName.SMALL_TALK:
        raise ValueError(f"the {task.strategy} strategy needs a worker")
    started = clock()
    outcome = SmallTalkReply().run(task.query)
    return _result(task, outcome, True, None, started, clock(), cost=0.0)


def _result(task: AnswerTask, outcome: StrategyResult, answerable: bool, reason: str | None,
            started: float, ended: float, cost: float) -> AnswerResult:
    """The result row of a run of `task` that produced `outcome`."""
    return AnswerResult(
        request_id=task.request_id, kind=task.kind, tier=task.tier, strategy=task.strategy,
        answer=outcome.answer, steps=outcome.steps,
        sources=tuple(Source(id=p.id, title=p.title, score=float(p.score)) for p in outcome.passages),
        timings=_timings(task, outcome, started, ended),
        answerable=answerable, abstain_reason=reason,
        prompt_tokens=outcome.usage.prompt_tokens, completion_tokens=outcome.usage.completion_tokens,
        cost=cost,
    )


def write_once(records: Records, result: AnswerResult, delivery: Delivery) -> AnswerResult:
    """Write the result once; whoever wrote first decides what every delivery returns (the
    stored row is read back only when another delivery wrote it first)."""
    if records.save_result(result, delivery.worker, delivery.attempt):
        return result
    return records.get_result(result.request_id, result.kind, result.tier) or result


def failure(
    task: AnswerTask, code: ErrorCode, detail: str, started: float | None = None,
    ended: float | None = None,
) -> AnswerResult:
    """The error result of `task` (no answer, the code and its detail)."""
    timings = Timings()
    if started is not None and ended is not None:
        timings = Timings(queue_wait_ms=_ms(started - task.enqueued_at), strategy_ms=_ms(ended - started))
    return AnswerResult(
        request_id=task.request_id, kind=task.kind, tier=task.tier, strategy=task.strategy,
        error=detail, error_code=code, timings=timings,
    )


def _timings(task: AnswerTask, outcome: StrategyResult, started: float, ended: float) -> Timings:
    phases = outcome.timings
    return Timings(
        queue_wait_ms=_ms(started - task.enqueued_at),
        strategy_ms=_ms(phases.get("total", ended - started)),
        retrieve_ms=_ms(phases.get("retrieve", 0.0)),
        generate_ms=_ms(phases.get("generate", 0.0)),
    )


def _ms(seconds: float) -> float:
    return round(max(seconds, 0.0) * 1000, 3)


def _describe(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}"
