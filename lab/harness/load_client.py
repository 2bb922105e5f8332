"""One asyncio gRPC load client of the front door that records every call it makes.

A user's calls on the stubs generated from the .proto (`Answer`, `GetResult`, `Route`, and the
health check), each recorded as a `CallRecord`: method, client request id, start, end, status code,
request id (the reply's or the `x-request-id` trailer's), tier, the reply's timings and classifier
facts, the `retry-after` hint of a refusal, the tenant and the experiment's own tags. `records` keeps
them in call order; `journal` appends each as a JSON line the moment it ends (a run that dies still
leaves its calls), `dump_jsonl` writes them at the end.

Three ways to load a front door, each the one definition the experiments share:
- `LoadClient.request`: one logical request as a good client makes it (retries after
  `retry-after`, follows a deadline with `GetResult`, gives up when its budget is spent);
- `open_loop`: sends due at a fixed rate whatever the earlier ones are doing;
- `closed_loop`: a fixed number of clients, each sending its next call when its reply is in.

The query goes in the `query` bytes field, which every version of the .proto has (a benchmark may
load a front door built from an older commit).
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import random
import time
import uuid
from collections.abc import Awaitable, Callable, Iterable, Mapping
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any, Generic, TextIO, TypeVar

from adaptive_rag.contracts import CallError

R = TypeVar("R")
T = TypeVar("T")

# A good client's reading of the statuses (the contract in docs/api.md):
RETRYABLE = ("UNAVAILABLE", "RESOURCE_EXHAUSTED", "CANCELLED")  # the same client_request_id again
# GetResult's FAILED_PRECONDITION reasons, read from the `x-error-code` trailer (older records,
# from before the trailer, by their message's words)
STILL_RUNNING = (CallError.NOT_FINISHED, "still")  # work in progress: the client waits
NEVER_RAN = (CallError.NEVER_RAN, "never ran")  # an accepted request a resend runs
RUN_AGAIN = (CallError.ANSWER_DEPENDENCY_UNAVAILABLE, "to run it again")  # its run failed; a resend runs it
# The final errors of a request that ran (docs/operating.md, "Status codes"): its result, which a
# resend returns; by status, with the reason that makes it final.
RESOLVED_ERRORS = {"DEADLINE_EXCEEDED": (CallError.ANSWER_TIME_LIMIT, "its tier's time limit"),
                   "INTERNAL": (CallError.ANSWER_FAILED, "failed in the worker")}
CLIENT_ERROR = "CLIENT_ERROR"  # the client itself failed (no status from the server)
GAVE_UP = "GAVE_UP"  # a logical request whose budget was spent
DETAIL_CHARS = 300
RECONNECT = (("grpc.initial_reconnect_backoff_ms", 250), ("grpc.min_reconnect_backoff_ms", 250),
             ("grpc.max_reconnect_backoff_ms", 1000))  # back soon after a restart of the front door


def tier_name(value: int) -> str | None:
    """`A` for TIER_A, ...; None for TIER_UNSPECIFIED."""
    from services.frontdoor.stubs import pb2

    return pb2.Tier.Name(value).removeprefix("TIER_") if value else None


def answer_digest(answer: str | None) -> str:
    """A short digest of an answer's text, so a log can tell two deliveries of one request apart
    without keeping the text."""
    return hashlib.sha256((answer or "").encode("utf-8")).hexdigest()[:16]


def reply_fields(reply: Any) -> dict[str, Any]:
    """What a record keeps of an `AnswerReply` or a `RouteReply`."""
    out: dict[str, Any] = {"tier": tier_name(reply.tier), "strategy": reply.strategy or None,
                           "fallback": reply.classifier.fallback,
                           "model_version": reply.classifier.model_version}
    if hasattr(reply, "answer"):
        out["answer_digest"] = answer_digest(reply.answer)
    if hasattr(reply, "timings"):
        t = reply.timings
        out.update(request_id=reply.request_id, classify_ms=t.classify_ms, queue_wait_ms=t.queue_wait_ms,
                   strategy_ms=t.strategy_ms, total_ms=t.total_ms, replayed=reply.replayed)
    else:
        out.update(request_id=reply.decision_id, classify_ms=reply.classify_ms)
    return out


def error_fields(error: Any) -> dict[str, Any]:
    """What a record keeps of a failed call: its status, message, error code, request id and
    retry-after hint."""
    from services.frontdoor.stubs import ERROR_CODE_METADATA

    code = error.code() if hasattr(error, "code") else None
    out: dict[str, Any] = {"code": code.name if code is not None else "UNKNOWN",
                           "detail": ((error.details() if hasattr(error, "details") else str(error)) or "")[:DETAIL_CHARS]}
    try:
        trailers = error.trailing_metadata() or ()
    except Exception:  # noqa: BLE001 - no metadata on a call that never reached the server
        trailers = ()
    for key, value in trailers:
        if key == "x-request-id":
            out["request_id"] = value
        elif key == ERROR_CODE_METADATA:
            out["error_code"] = value
        elif key == "retry-after":
            try:
                out["retry_after_s"] = float(value)
            except ValueError:
                out["detail"] = f"bad retry-after {value!r}; {out['detail']}"
    return out


@dataclass
class CallRecord:
    """One gRPC call as the client saw it."""

    method: str  # Answer | GetResult | Route | Check
    client_request_id: str | None
    start: float  # wall clock (s) when the call was sent
    end: float  # start + the call's duration on the monotonic clock
    code: str  # OK, a gRPC status name, or CLIENT_ERROR
    request_id: str | None = None  # the reply's (Route: its decision id), or the x-request-id trailer
    tier: str | None = None
    strategy: str | None = None
    classify_ms: float | None = None
    queue_wait_ms: float | None = None
    strategy_ms: float | None = None
    total_ms: float | None = None
    fallback: bool | None = None  # the rules routed it (the classifier did not answer)
    model_version: int | None = None
    replayed: bool | None = None
    answer_digest: str | None = None  # of the reply's answer text (`answer_digest`)
    retry_after_s: float | None = None
    detail: str = ""
    error_code: str | None = None  # the front door's stable reason (`x-error-code`, CallError)
    tenant: str | None = None
    attempt: int = 1  # of its logical request (Answer and GetResult counted together)
    tags: dict[str, Any] = field(default_factory=dict)  # the experiment's labels (phase, block, ...)

    @property
    def ok(self) -> bool:
        return self.code == "OK"

    @property
    def latency_ms(self) -> float:
        return 1000.0 * (self.end - self.start)

    @property
    def overhead_ms(self) -> float | None:
        """What the front door itself spent: total - queue wait - strategy (answered calls)."""
        if self.total_ms is None or self.queue_wait_ms is None or self.strategy_ms is None:
            return None
        return self.total_ms - self.queue_wait_ms - self.strategy_ms

    @property
    def is_poll(self) -> bool:
        """A GetResult that says "still running": the client waits, nothing failed."""
        return self.method == "GetResult" and self.code == "FAILED_PRECONDITION" and self.says(STILL_RUNNING)

    @property
    def resolves(self) -> bool:
        """The call ends its request as the contract allows: OK, or a final error of a run
        (`RESOLVED_ERRORS`); anything else leaves the request unanswered."""
        return self.ok or (self.code in RESOLVED_ERRORS and self.says(RESOLVED_ERRORS[self.code]))

    def says(self, reason: tuple[str, str]) -> bool:
        """The call failed for `reason` (its error code; a record without one: its message)."""
        code, words = reason
        return self.error_code == code if self.error_code else words in self.detail

    def as_dict(self) -> dict[str, Any]:
        """A JSON object of the record without its empty fields."""
        return {k: v for k, v in asdict(self).items() if v is not None and v != "" and v != {}}

    @classmethod
    def from_dict(cls, item: Mapping[str, Any]) -> CallRecord:
        known = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in item.items() if k in known})


@dataclass
class Outcome:
    """One logical request as a good client saw it, from its first send to its end."""

    client_request_id: str
    sent: float  # wall clock (s)
    done: float
    final: str  # OK, GAVE_UP (budget spent) or the terminal status
    attempts: int
    tier: str | None = None
    request_ids: list[str] = field(default_factory=list)  # every one a call named, in order
    tags: dict[str, Any] = field(default_factory=dict)

    @property
    def latency_ms(self) -> float:
        return 1000.0 * (self.done - self.sent)


class LoadClient:
    """grpc.aio client of one front door; every call ends up in `records`.

    `api_keys`: one key, or tenant -> key (a call then names its tenant). `channels`: connections
    to open (a call names its `lane`, lane % channels), so concurrent clients need not share one."""

    def __init__(self, address: str, api_keys: str | Mapping[str, str], *, channels: int = 1,
                 journal: Path | TextIO | None = None, reconnect_fast: bool = False) -> None:
        import grpc
        from grpc_health.v1 import health_pb2, health_pb2_grpc

        from services.frontdoor.stubs import pb2, pb2_grpc

        self.grpc, self.pb2, self.health_pb2 = grpc, pb2, health_pb2
        options = list(RECONNECT) if reconnect_fast else []
        self.channels = [grpc.aio.insecure_channel(address, options=options) for _ in range(max(1, channels))]
        self.stubs = [pb2_grpc.AdaptiveRagStub(c) for c in self.channels]
        self.health_stub = health_pb2_grpc.HealthStub(self.channels[0])
        keys = {None: api_keys} if isinstance(api_keys, str) else dict(api_keys)
        self.auth = {tenant: (("authorization", f"Bearer {key}"),) for tenant, key in keys.items()}
        self.records: list[CallRecord] = []
        self._journal, self._own_journal = self._open(journal)

    @staticmethod
    def _open(journal: Path | TextIO | None) -> tuple[TextIO | None, bool]:
        if journal is None or hasattr(journal, "write"):
            return journal, False  # type: ignore[return-value]
        return Path(journal).open("a", encoding="utf-8"), True

    async def __aenter__(self) -> LoadClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def ready(self, timeout: float = 30.0) -> None:
        """Wait until every channel is connected (so a first call does not time the connecting)."""
        await asyncio.wait_for(asyncio.gather(*(c.channel_ready() for c in self.channels)), timeout)

    async def close(self) -> None:
        for channel in self.channels:
            await channel.close()
        if self._journal is not None and self._own_journal:
            self._journal.close()
        self._journal = None

    def record(self, record: CallRecord) -> CallRecord:
        """Keep `record` (and append it to the journal)."""
        self.records.append(record)
        if self._journal is not None:
            self._journal.write(json.dumps({"type": "call", **record.as_dict()}) + "\n")
        return record

    def note(self, item: Mapping[str, Any]) -> None:
        """Another line in the journal (an outcome, a health sample): one file per run."""
        if self._journal is not None:
            self._journal.write(json.dumps(dict(item)) + "\n")

    def dump_jsonl(self, path: Path) -> Path:
        """Every record as one JSON line (the records of the run so far)."""
        with Path(path).open("w", encoding="utf-8") as out:
            for record in self.records:
                out.write(json.dumps(record.as_dict()) + "\n")
        return path

    def _metadata(self, tenant: str | None) -> tuple[tuple[str, str], ...]:
        if tenant in self.auth:
            return self.auth[tenant]
        if tenant is None and len(self.auth) == 1:
            return next(iter(self.auth.values()))
        raise KeyError(f"no API key for tenant {tenant!r}")

    async def _call(self, method: str, request: Any, *, client_request_id: str | None, tenant: str | None,
                    timeout: float, attempt: int, lane: int, tags: Mapping[str, Any] | None) -> CallRecord:
        stub = self.stubs[lane % len(self.stubs)]
        start, started = time.time(), time.perf_counter()
        found: dict[str, Any]
        try:
            reply = await getattr(stub, method)(request, metadata=self._metadata(tenant), timeout=max(0.05, timeout))
            found = {"code": "OK", **reply_fields(reply)}
        except self.grpc.aio.AioRpcError as exc:
            found = error_fields(exc)
        except Exception as exc:  # noqa: BLE001 - a load client keeps going whatever happens
            found = {"code": CLIENT_ERROR, "detail": f"{type(exc).__name__}: {exc}"[:DETAIL_CHARS]}
        end = start + (time.perf_counter() - started)
        return self.record(CallRecord(method, client_request_id, start, end, tenant=tenant, attempt=attempt,
                                      tags=dict(tags or {}), **found))

    async def answer(self, query: str, *, client_request_id: str | None = None, tenant: str | None = None,
                     timeout: float = 30.0, attempt: int = 1, lane: int = 0,
                     tags: Mapping[str, Any] | None = None) -> CallRecord:
        """One `Answer` call (a fresh client_request_id unless given)."""
        cid = client_request_id or uuid.uuid4().hex
        request = self.pb2.AnswerRequest(query=query.encode("utf-8"), client_request_id=cid)
        return await self._call("Answer", request, client_request_id=cid, tenant=tenant, timeout=timeout,
                                attempt=attempt, lane=lane, tags=tags)

    async def get_result(self, request_id: str, *, client_request_id: str | None = None, tenant: str | None = None,
                         timeout: float = 5.0, attempt: int = 1, lane: int = 0,
                         tags: Mapping[str, Any] | None = None) -> CallRecord:
        """One `GetResult` call for `request_id`."""
        return await self._call("GetResult", self.pb2.GetResultRequest(request_id=request_id),
                                client_request_id=client_request_id, tenant=tenant, timeout=timeout,
                                attempt=attempt, lane=lane, tags=tags)

    async def route(self, query: str, *, tenant: str | None = None, timeout: float = 30.0, lane: int = 0,
                    tags: Mapping[str, Any] | None = None) -> CallRecord:
        """One `Route` call (the decision only; nothing runs)."""
        return await self._call("Route", self.pb2.RouteRequest(query=query.encode("utf-8")),
                                client_request_id=None, tenant=tenant, timeout=timeout, attempt=1, lane=lane,
                                tags=tags)

    async def request(self, query: str, *, budget_s: float, call_timeout_s: float, poll_s: float = 1.0,
                      client_request_id: str | None = None, tenant: str | None = None,
                      tags: Mapping[str, Any] | None = None) -> Outcome:
        """One logical request as a good client makes it: `Answer`; UNAVAILABLE / RESOURCE_EXHAUSTED /
        CANCELLED -> the same client_request_id again after the `retry-after` hint; DEADLINE_EXCEEDED
        -> `GetResult` with the request id until the answer is there (a request that never ran, or
        whose run failed for a dependency, is sent again); until OK, a final error of the run
        (`RESOLVED_ERRORS`), another status (INTERNAL, INVALID_ARGUMENT, ...: a good client stops)
        or `budget_s` is spent (GAVE_UP)."""
        cid = client_request_id or uuid.uuid4().hex
        sent = time.time()
        limit = sent + budget_s
        request_id: str | None = None
        request_ids: list[str] = []
        mode, n, final, tier = "answer", 0, GAVE_UP, None

        async def pause(seconds: float) -> None:
            await asyncio.sleep(min(seconds, max(0.0, limit - time.time())))

        while time.time() < limit:
            n += 1
            remaining = limit - time.time()
            if mode == "answer":
                call = await self.answer(query, client_request_id=cid, tenant=tenant,
                                         timeout=min(call_timeout_s, remaining), attempt=n, tags=tags)
            else:
                call = await self.get_result(request_id or "", client_request_id=cid, tenant=tenant,
                                             timeout=min(5.0, remaining), attempt=n, tags=tags)
            if call.request_id:
                request_id = call.request_id
                if call.request_id not in request_ids:
                    request_ids.append(call.request_id)
            if call.resolves:
                final, tier = call.code, call.tier
                break
            if call.code in RETRYABLE:
                if mode == "get" and call.says(RUN_AGAIN):
                    mode = "answer"
                await pause(max(call.retry_after_s or 1.0, 0.2) * random.uniform(1.0, 1.2))
                continue
            if call.code == "DEADLINE_EXCEEDED":
                mode = "get" if request_id else "answer"
                await pause(poll_s)
                continue
            if mode == "get" and call.code == "FAILED_PRECONDITION":
                if call.says(NEVER_RAN):
                    mode = "answer"
                await pause(poll_s)
                continue
            if mode == "get" and call.code == "NOT_FOUND":
                mode = "answer"
                continue
            if call.code == CLIENT_ERROR:
                await pause(1.0)
                continue
            final = call.code
            break
        return Outcome(cid, sent, time.time(), final, n, tier, request_ids, dict(tags or {}))

    async def health(self, timeout: float = 1.0) -> tuple[bool, str]:
        """(serving, status name) of the front door's readiness; no answer counts as not serving."""
        try:
            reply = await self.health_stub.Check(self.health_pb2.HealthCheckRequest(service=""), timeout=timeout)
        except Exception as exc:  # noqa: BLE001
            code = getattr(exc, "code", None)
            return False, code().name if callable(code) else type(exc).__name__
        status = self.health_pb2.HealthCheckResponse.ServingStatus.Name(reply.status)
        return reply.status == self.health_pb2.HealthCheckResponse.SERVING, status


# --- load shapes ----------------------------------------------------------------------------------


@dataclass
class OpenLoop(Generic[R]):
    """What an open loop sent: each send's result with its index and lateness, in send order."""

    results: list[R] = field(default_factory=list)
    indices: list[int] = field(default_factory=list)  # the send slot k of each result
    late_s: list[float] = field(default_factory=list)  # how much later than due each was sent
    skipped: int = 0  # slots not sent: the in-flight cap was reached, or the loop fell behind
    seconds: float = 0.0  # from the first slot to the last send (or the stop)
    max_in_flight_seen: int = 0


async def open_loop(send: Callable[[int], Awaitable[R]], rate: float, *, count: int | None = None,
                    stop: asyncio.Event | None = None, start: float | None = None,
                    max_in_flight: int | None = None, max_lag_periods: float | None = None) -> OpenLoop[R]:
    """Open loop: slot k is due at start + k / rate (monotonic clock; start: now) and sends
    `send(k)` whatever the earlier sends are doing; until `count` slots or `stop`. A slot due while
    `max_in_flight` sends are outstanding is skipped; one found more than `max_lag_periods` periods
    late (a stalled event loop) skips the missed slots instead of sending them in a burst. Returns
    once every send has finished."""
    period = 1.0 / rate
    origin = time.monotonic() if start is None else start
    out: OpenLoop[R] = OpenLoop()
    pending: set[asyncio.Task[R]] = set()
    tasks: list[tuple[int, float, asyncio.Task[R]]] = []
    k = 0
    while count is None or k < count:
        delay = origin + k * period - time.monotonic()
        if stop is not None:
            try:
                await asyncio.wait_for(stop.wait(), timeout=max(0.0, delay))
                break
            except asyncio.TimeoutError:
                pass
        elif delay > 0:
            await asyncio.sleep(delay)
        late = time.monotonic() - (origin + k * period)
        if max_lag_periods is not None and late > max_lag_periods * period:
            missed = int(late / period)
            out.skipped += missed
            k += missed
            if count is not None and k >= count:
                break
            late -= missed * period
        if max_in_flight is not None and len(pending) >= max_in_flight:
            out.skipped += 1
        else:
            task = asyncio.create_task(send(k))  # type: ignore[arg-type]
            pending.add(task)
            task.add_done_callback(pending.discard)
            tasks.append((k, late, task))
            out.max_in_flight_seen = max(out.max_in_flight_seen, len(pending))
        k += 1
    out.seconds = time.monotonic() - origin
    for index, late, task in tasks:
        out.results.append(await task)
        out.indices.append(index)
        out.late_s.append(late)
    return out


async def closed_loop(send: Callable[[T, int], Awaitable[R]], items: Iterable[T], clients: int) -> list[R]:
    """Closed loop: `clients` clients, each sending `send(item, its lane)` for the next item when
    its previous reply is in; results in completion order."""
    todo = list(items)
    todo.reverse()
    results: list[R] = []

    async def client(lane: int) -> None:
        while todo:
            results.append(await send(todo.pop(), lane))

    await asyncio.gather(*(client(lane) for lane in range(max(1, clients))))
    return results


def read_jsonl(path: Path) -> list[CallRecord]:
    """The call records of a journal or a `dump_jsonl` file (other lines left out)."""
    out = []
    for line in Path(path).read_text(encoding="utf-8").splitlines():
        if line.strip():
            item = json.loads(line)
            if item.get("type", "call") == "call":
                item.pop("type", None)
                out.append(CallRecord.from_dict(item))
    return out
