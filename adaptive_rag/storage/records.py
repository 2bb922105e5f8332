"""The serving records (API keys, requests, routing decisions, results, feedback) behind one API.

The front door and the workers share this store; it returns plain frozen dataclasses so no ORM
object (and no session) leaks across process or thread boundaries. Writes that can race between
replicas are decided by the database: unique constraints for requests,
`INSERT ... ON CONFLICT DO NOTHING` for results, so a task delivered twice writes one row, and
conditional updates for the moves of a request that a worker, a sweeping front door and a
resending client may try at the same moment (`begin_run`, `expire_queued`, `readmit`): whichever
commits first wins, the others change nothing.

A request row is also the outbox of its task: written with `enqueued_at` empty, marked once the
task is handed to the broker (`mark_enqueued`); one still queued and never marked is published
again by `publish_unpublished` (a front door that died between the two, or a lost mark).

Round trips are what a serving call pays for most on a busy machine (each one waits for the
database process to be scheduled), so calls on the serving path are one statement each: reads and
single-statement writes run in autocommit (no BEGIN / COMMIT round trips), and the writes that
touch two tables on PostgreSQL are one statement with a data-modifying CTE (atomic on its own).
The statements of the per-Answer calls are built once with bound parameters (`_HotStatements`):
building one per call, and its cache key, costs more CPU than its round trip.
"""

from __future__ import annotations

import hashlib
import secrets
import time
from collections.abc import Callable, Collection
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import Engine, Table, bindparam, delete, exists, func, select, update
from sqlalchemy.exc import IntegrityError

from adaptive_rag.contracts import (
    DEFAULT_SCOPES, IN_FLIGHT, NEVER_RAN, RETRYABLE_ERRORS, AnswerResult, AnswerTask, ConversationTurn,
    ErrorCode, Principal, RequestStatus, RequestView, ResultKind, RoutingDecision, Scope, Source, Tier, Timings,
)
from adaptive_rag.errors import (
    AdaptiveRagError, ConfigurationError, DuplicateRequestError, RequestNotFoundError,
)
from adaptive_rag.storage.db import map_database_errors
from adaptive_rag.storage.locks import advisory_lock
from adaptive_rag.storage.models import (
    FEEDBACK_RATINGS, ApiKey, Feedback, QueryRequest, QueryResult, as_utc, utcnow,
)
from adaptive_rag.storage.models import RoutingDecision as DecisionRow

KEY_PREFIX = "arag_"
# The PostgreSQL advisory lock one front door replica holds while it sweeps expired requests.
EXPIRY_SWEEP_LOCK = "arag-sweep:expire-queued"
# Unpublished requests one relay pass publishes at most (the rest wait for the next pass).
RELAY_BATCH = 100


REQUEST_COLUMNS = ("request_id", "tenant", "client_request_id", "query", "status", "created_at",
                   "updated_at", "conversation_id", "standalone_query", "rewrite")
DECISION_COLUMNS = ("request_id", "created_at", *RoutingDecision.model_fields)
RESULT_COLUMNS = (*AnswerResult.model_fields, "attempts", "worker", "created_at")


def _bound(table: Table, prefix: str, names: Any) -> dict[str, Any]:
    """A bound parameter per column (named `<prefix><column>`, typed like it)."""
    return {name: bindparam(prefix + name, type_=table.c[name].type) for name in names}


class _HotStatements:
    """The statements of the calls every Answer makes, built once (see the module)."""

    def __init__(self, insert: Any, ctes: bool) -> None:
        requests, decisions = QueryRequest.__table__, DecisionRow.__table__
        request_values = _bound(requests, "r_", REQUEST_COLUMNS)
        self.request = insert(QueryRequest).values(request_values).on_conflict_do_nothing() \
            .returning(QueryRequest.request_id)
        # A request answered where it was admitted: finished, its one run begun and published.
        self.answered_request = insert(QueryRequest).values({
            **request_values, **_bound(requests, "r_", ("runs", "deliveries", "enqueued_at")),
        }).on_conflict_do_nothing().returning(QueryRequest.request_id)
        decision_values = _bound(decisions, "d_", DECISION_COLUMNS)
        self.decision = insert(DecisionRow).values(decision_values)
        # PostgreSQL: the decision is inserted only when the request was (one statement).
        inserted = self.request.cte("inserted_request")
        self.request_and_decision = insert(DecisionRow).from_select(
            list(DECISION_COLUMNS),
            select(inserted.c.request_id, *list(decision_values.values())[1:]),
        ).returning(DecisionRow.request_id) if ctes else None
        result_values = _bound(QueryResult.__table__, "v_", RESULT_COLUMNS)
        self.result = insert(QueryResult).values(result_values).on_conflict_do_nothing(
            index_elements=["request_id", "kind", "tier"]
        ).returning(QueryResult.id)  # a row comes back only when this insert happened
        # The outbox mark: the task was handed to the broker (its age for the expiry sweep is
        # left as it is; the mark comes milliseconds after the insert).
        self.enqueued = update(QueryRequest).where(
            QueryRequest.request_id == bindparam("e_request_id"), QueryRequest.enqueued_at.is_(None),
        ).values(enqueued_at=bindparam("e_enqueued_at"), updated_at=QueryRequest.updated_at)
        self.finish = update(QueryRequest).where(
            QueryRequest.request_id == bindparam("f_request_id")
        ).values(status=bindparam("f_status"), updated_at=bindparam("f_updated_at"))
        written = self.result.cte("written_result")
        # PostgreSQL: a primary result finishes its request only when it was written.
        self.result_and_finish = self.finish.where(exists(select(written.c.id))) \
            .returning(QueryRequest.request_id) if ctes else None
        in_flight = [s.value for s in IN_FLIGHT]
        # The run's tenant, when the caller names it (a worker does: the task's); NULL matches any.
        own = QueryRequest.tenant == func.coalesce(bindparam("b_tenant", type_=requests.c.tenant.type),
                                                   QueryRequest.tenant)
        self.begin = {
            ResultKind.PRIMARY: update(QueryRequest).where(
                QueryRequest.request_id == bindparam("b_request_id"), own,
                QueryRequest.status.in_(in_flight),
            ).values(status=RequestStatus.RUNNING.value, updated_at=bindparam("b_updated_at"),
                     deliveries=QueryRequest.deliveries + 1, runs=QueryRequest.runs + 1,
                     ).returning(QueryRequest.deliveries),
            # a shadow run leaves the request as it is (its age in the queue too)
            ResultKind.SHADOW: update(QueryRequest).where(
                QueryRequest.request_id == bindparam("b_request_id"), own,
            ).values(shadow_deliveries=QueryRequest.shadow_deliveries + 1)
            .returning(QueryRequest.shadow_deliveries),
        }


class SweepBusyError(AdaptiveRagError):
    """Another process is sweeping the queued requests right now."""


def hash_key(key: str) -> str:
    """The stored form of an API key (sha256 hex): a database leak does not leak usable keys."""
    return hashlib.sha256(key.encode("utf-8")).hexdigest()


def _scopes_column(scopes: frozenset[Scope]) -> str:
    return ",".join(sorted(s.value for s in scopes))


def _parse_scopes(column: str) -> frozenset[Scope]:
    return frozenset(Scope(s) for s in column.split(",") if s)


@dataclass(frozen=True, slots=True)
class ApiKeyView:
    id: int
    tenant: str
    key_prefix: str
    created_at: datetime
    revoked_at: datetime | None
    scopes: frozenset[Scope] = DEFAULT_SCOPES


@dataclass(frozen=True, slots=True)
class StoredResult:
    """A result row: the result itself and how it was delivered (for operators and tests)."""

    result: AnswerResult
    attempts: int
    worker: str
    created_at: datetime | None


class RecordStore:
    """Reads and writes the serving records through one SQLAlchemy engine (SQLite or PostgreSQL).

    A database that does not answer is `DatabaseUnavailableError` from every call
    (`map_database_errors`); no SQLAlchemy exception leaves this store."""

    def __init__(self, engine: Engine) -> None:
        map_database_errors(engine)  # before the autocommit engine below is derived from it
        self.engine = engine
        if engine.dialect.name == "postgresql":
            from sqlalchemy.dialects.postgresql import insert
        elif engine.dialect.name == "sqlite":
            from sqlalchemy.dialects.sqlite import insert
        else:  # pragma: no cover - the project supports these two
            raise ConfigurationError(
                f"records need SQLite or PostgreSQL, not {engine.dialect.name!r}"
            )
        self._insert = insert
        # One-statement calls: no transaction round trips (`engine.begin()` stays transactional).
        self._autocommit = engine.execution_options(isolation_level="AUTOCOMMIT")
        self._ctes = engine.dialect.name == "postgresql"  # writes with a data-modifying CTE
        self._hot = _HotStatements(insert, self._ctes)

    def ping(self) -> None:
        """One round trip to the database (health checks); raises when it does not answer."""
        with self.engine.connect() as conn:
            conn.execute(select(1))

    # --- API keys -------------------------------------------------------------------------------
    def create_api_key(self, tenant: str, scopes: frozenset[Scope] = DEFAULT_SCOPES) -> str:
        """A new key for `tenant` with `scopes`; the plaintext is returned once and never stored."""
        if not tenant.strip():
            raise ValueError("tenant must not be empty")
        if len(tenant) > 64:
            raise ValueError(f"tenant must be at most 64 characters, not {len(tenant)}")
        if not scopes:
            raise ValueError("a key needs at least one scope")
        key = KEY_PREFIX + secrets.token_urlsafe(24)
        with self.engine.begin() as conn:
            conn.execute(
                self._insert(ApiKey).values(
                    tenant=tenant, key_prefix=key[:8], key_hash=hash_key(key),
                    scopes=_scopes_column(frozenset(Scope(s) for s in scopes)), created_at=utcnow(),
                )
            )
        return key

    def principal_for_key(self, key: str) -> Principal | None:
        """The tenant owning `key` and the key's scopes, or None for an unknown or revoked key."""
        with self._autocommit.connect() as conn:
            row = conn.execute(
                select(ApiKey.tenant, ApiKey.scopes).where(
                    ApiKey.key_hash == hash_key(key), ApiKey.revoked_at.is_(None)
                )
            ).first()
        return None if row is None else Principal(tenant=row.tenant, scopes=_parse_scopes(row.scopes))

    def tenant_for_key(self, key: str) -> str | None:
        """The tenant owning `key`, or None for an unknown or revoked key."""
        principal = self.principal_for_key(key)
        return principal.tenant if principal else None

    def list_api_keys(self) -> list[ApiKeyView]:
        with self.engine.connect() as conn:
            rows = conn.execute(
                select(
                    ApiKey.id, ApiKey.tenant, ApiKey.key_prefix, ApiKey.created_at,
                    ApiKey.revoked_at, ApiKey.scopes,
                ).order_by(ApiKey.id)
            )
            return [
                ApiKeyView(r.id, r.tenant, r.key_prefix, as_utc(r.created_at), as_utc(r.revoked_at),
                           _parse_scopes(r.scopes))
                for r in rows
            ]

    def api_keys_revision(self) -> tuple[int, int, int]:
        """A fingerprint of the key table that changes whenever a key is revoked, created or
        deleted (rows, revoked rows, highest id): one small aggregate read, which every front door
        makes every `ARAG_KEY_REVOCATION` seconds to drop its cached keys when it changed."""
        with self._autocommit.connect() as conn:
            rows, revoked, newest = conn.execute(
                select(func.count(), func.count(ApiKey.revoked_at), func.coalesce(func.max(ApiKey.id), 0))
            ).one()
        return int(rows), int(revoked), int(newest)

    def revoke_api_key(self, key_id: int) -> bool:
        """Revoke one key by id; False when there is no such active key."""
        with self.engine.begin() as conn:
            result = conn.execute(
                update(ApiKey)
                .where(ApiKey.id == key_id, ApiKey.revoked_at.is_(None))
                .values(revoked_at=utcnow())
            )
            return result.rowcount == 1

    # --- requests -------------------------------------------------------------------------------
    def create_request(
        self, request_id: str, tenant: str, client_request_id: str | None, query: str,
        status: RequestStatus = RequestStatus.QUEUED, decision: RoutingDecision | None = None,
        conversation_id: str | None = None, standalone_query: str | None = None,
        rewrite: str | None = None,
    ) -> RequestView:
        """Record a new request as `status` (`queued`; a decision-only request: `routed`), and its
        routing `decision` when given, atomically.

        Raises `DuplicateRequestError` when the request id or `(tenant, client_request_id)` is
        already recorded (nothing is written then): this insert is the idempotency check, and the
        caller reads the existing request with `find_request`. On PostgreSQL it is one statement
        (`INSERT ... ON CONFLICT DO NOTHING` feeding the decision's insert through a CTE).

        `conversation_id`: the conversation it continues (None: it starts its own, named by its
        request id); `standalone_query`, `rewrite`: the question a follow-up was rewritten into
        and how (None: the query as sent).
        """
        now = utcnow()
        hot = self._hot
        params: dict[str, Any] = {
            "r_request_id": request_id, "r_tenant": tenant, "r_client_request_id": client_request_id,
            "r_query": query, "r_status": RequestStatus(status).value, "r_created_at": now,
            "r_updated_at": now, "r_conversation_id": conversation_id or request_id,
            "r_standalone_query": standalone_query, "r_rewrite": rewrite,
        }
        if decision is not None:
            params.update({f"d_{k}": v for k, v in decision.model_dump(mode="json").items()},
                          d_request_id=request_id, d_created_at=now)
        if decision is None or hot.request_and_decision is not None:
            with self._autocommit.connect() as conn:
                created = conn.execute(hot.request_and_decision if decision is not None
                                       else hot.request, params).first() is not None
        else:
            with self.engine.begin() as conn:
                created = conn.execute(hot.request, params).first() is not None
                if created:
                    conn.execute(hot.decision, params)
        if not created:
            raise DuplicateRequestError(
                f"request {request_id!r} / client request id {client_request_id!r} of tenant "
                f"{tenant!r} is already recorded"
            )
        return RequestView(request_id, tenant, client_request_id, query, RequestStatus(status), now, now,
                           conversation_id=conversation_id or request_id,
                           standalone_query=standalone_query, rewrite=rewrite)

    def record_answered(
        self, request_id: str, tenant: str, client_request_id: str | None, query: str,
        decision: RoutingDecision, result: AnswerResult, worker: str,
        conversation_id: str | None = None, standalone_query: str | None = None,
        rewrite: str | None = None,
    ) -> None:
        """Record a request answered where it was admitted (small talk: no queue, no worker):
        the request finished after one run, its decision and its result row, in one transaction,
        so a crash leaves all of it or none (nothing to relay, nothing half done). Raises
        `DuplicateRequestError` as `create_request` does, with nothing written."""
        now = utcnow()
        hot = self._hot
        status = RequestStatus.DONE if result.ok else RequestStatus.ERROR
        params: dict[str, Any] = {
            "r_request_id": request_id, "r_tenant": tenant, "r_client_request_id": client_request_id,
            "r_query": query, "r_status": status.value, "r_created_at": now, "r_updated_at": now,
            "r_conversation_id": conversation_id or request_id, "r_standalone_query": standalone_query,
            "r_rewrite": rewrite, "r_runs": 1, "r_deliveries": 1, "r_enqueued_at": now,
            "d_request_id": request_id, "d_created_at": now,
            **{f"d_{k}": v for k, v in decision.model_dump(mode="json").items()},
            **{f"v_{k}": v for k, v in result.model_dump(mode="json").items()},
            "v_attempts": 1, "v_worker": worker, "v_created_at": now,
        }
        with self.engine.begin() as conn:
            if conn.execute(hot.answered_request, params).first() is None:
                raise DuplicateRequestError(
                    f"request {request_id!r} / client request id {client_request_id!r} of tenant "
                    f"{tenant!r} is already recorded")
            conn.execute(hot.decision, params)
            conn.execute(hot.result, params)

    def conversation_turns(self, tenant: str, conversation_id: str, since: datetime,
                           limit: int) -> list[ConversationTurn] | None:
        """The last `limit` turns of `tenant`'s conversation recorded since `since`, oldest
        first, with their primary answers; None when it has none (no such conversation, another
        tenant's, or every turn older than `since`: a caller cannot tell these apart)."""
        answers = (select(QueryResult.request_id, QueryResult.answer)
                   .where(QueryResult.kind == ResultKind.PRIMARY.value).subquery())
        query = (
            select(QueryRequest.request_id, QueryRequest.query, QueryRequest.standalone_query,
                   answers.c.answer)
            .outerjoin(answers, answers.c.request_id == QueryRequest.request_id)
            .where(QueryRequest.tenant == tenant, QueryRequest.conversation_id == conversation_id,
                   QueryRequest.created_at >= since)
            .order_by(QueryRequest.created_at.desc()).limit(limit)
        )
        with self._autocommit.connect() as conn:
            rows = conn.execute(query).all()
        if not rows:
            return None
        return [ConversationTurn(r.request_id, r.standalone_query or r.query, r.answer or "")
                for r in reversed(rows)]

    def mark_enqueued(self, request_id: str) -> None:
        """Mark the request's task as handed to the broker (one statement; a no-op when it was
        marked already): the relay then leaves it alone."""
        with self._autocommit.connect() as conn:
            conn.execute(self._hot.enqueued, {"e_request_id": request_id, "e_enqueued_at": utcnow()})

    def publish_unpublished(
        self, publish: Callable[[AnswerTask], None], older_than_s: float,
        request_id: str | None = None, limit: int = RELAY_BATCH,
    ) -> list[str]:
        """Publish again the task of each request still `queued` whose publish was never marked
        (`mark_enqueued`) and that has not changed for `older_than_s`; mark each one published,
        and return their ids (`request_id`: that request only).

        `publish(task)` hands one task to the broker; when it raises, the ones published before
        it are marked and its error is raised. A publish twice is harmless (the worker writes the
        result once), so the age only keeps the relay off requests whose own admission is still
        between its insert and its publish.

        On PostgreSQL the rows are claimed `FOR UPDATE SKIP LOCKED` and stay locked until they
        are marked: front door replicas relaying at once take disjoint rows, and a relay that
        dies before its commit leaves its rows unmarked for the next one. SQLite (one machine)
        reads and marks without row locks.
        """
        cutoff = utcnow() - timedelta(seconds=older_than_s)
        claim = self._queued_tasks(QueryRequest.enqueued_at.is_(None), QueryRequest.updated_at <= cutoff)
        claim = claim.order_by(QueryRequest.updated_at).limit(limit)
        if request_id is not None:
            claim = claim.where(QueryRequest.request_id == request_id)
        return self._claim_and_publish(claim, publish)

    def undelivered(self, older_than_s: float, limit: int = RELAY_BATCH) -> list[str]:
        """Requests still `queued` whose task was marked published at least `older_than_s` ago
        and never delivered to a worker (the oldest first): either waiting their turn in the
        queue, or lost on the way (the broker handed the message to a worker host that died
        before it wrote its reserved copy). Only the broker can tell which
        (`TaskQueue.held`)."""
        cutoff = utcnow() - timedelta(seconds=older_than_s)
        statement = (
            select(QueryRequest.request_id)
            .where(QueryRequest.status == RequestStatus.QUEUED.value, QueryRequest.deliveries == 0,
                   QueryRequest.enqueued_at.is_not(None), QueryRequest.enqueued_at <= cutoff)
            .order_by(QueryRequest.enqueued_at).limit(limit)
        )
        with self._autocommit.connect() as conn:
            return list(conn.execute(statement).scalars())

    def publish_lost(
        self, publish: Callable[[AnswerTask], None], request_ids: Collection[str], older_than_s: float,
    ) -> list[str]:
        """Publish again the tasks of `request_ids` that the broker no longer holds, when each is
        still undelivered `older_than_s` after its publish (as `undelivered` found it: no worker
        began it meanwhile, no other front door published it again), and mark them published
        now; returns their ids. Rows are claimed as in `publish_unpublished`, so replicas that
        found the same loss publish it once."""
        if not request_ids:
            return []
        cutoff = utcnow() - timedelta(seconds=older_than_s)
        claim = self._queued_tasks(QueryRequest.request_id.in_(list(request_ids)), QueryRequest.deliveries == 0,
                                   QueryRequest.enqueued_at.is_not(None), QueryRequest.enqueued_at <= cutoff)
        return self._claim_and_publish(claim.order_by(QueryRequest.enqueued_at), publish)

    @staticmethod
    def _queued_tasks(*conditions: Any) -> Any:
        """The task (id, tenant, question as searched, tier, strategy) of each `queued` request
        meeting `conditions`."""
        return (
            select(QueryRequest.request_id, QueryRequest.tenant,
                   func.coalesce(QueryRequest.standalone_query, QueryRequest.query).label("query"),
                   DecisionRow.tier, DecisionRow.strategy)
            .join(DecisionRow, DecisionRow.request_id == QueryRequest.request_id)
            .where(QueryRequest.status == RequestStatus.QUEUED.value, *conditions)
        )

    def _claim_and_publish(self, claim: Any, publish: Callable[[AnswerTask], None]) -> list[str]:
        """Claim the rows `claim` selects, publish each one's task and mark it published: on
        PostgreSQL `FOR UPDATE SKIP LOCKED`, held until the marks commit."""
        if self.engine.dialect.name == "postgresql":
            with self.engine.begin() as conn:
                rows = conn.execute(claim.with_for_update(of=QueryRequest, skip_locked=True)).all()
                published, failure = self._publish_rows(conn, rows, publish)
        else:
            with self._autocommit.connect() as conn:
                rows = conn.execute(claim).all()
                published, failure = self._publish_rows(conn, rows, publish)
        if failure is not None:
            raise failure
        return published

    @staticmethod
    def _publish_rows(
        conn: Any, rows: Any, publish: Callable[[AnswerTask], None],
    ) -> tuple[list[str], Exception | None]:
        """Publish each row's task until one fails, then mark the published ones (their age for
        the expiry sweep starts again: their message is new)."""
        published: list[str] = []
        failure: Exception | None = None
        for row in rows:
            try:
                publish(AnswerTask(request_id=row.request_id, tenant=row.tenant, query=row.query,
                                   tier=Tier(row.tier), strategy=row.strategy, enqueued_at=time.time()))
            except Exception as exc:  # noqa: BLE001 - raised once the others are marked
                failure = exc
                break
            published.append(row.request_id)
        if published:
            now = utcnow()
            conn.execute(update(QueryRequest).where(QueryRequest.request_id.in_(published))
                         .values(enqueued_at=now, updated_at=now))
        return published, failure

    def find_request(self, tenant: str, client_request_id: str) -> RequestView | None:
        """The request a client already sent with this idempotency id, if any."""
        return self._one_request(
            (QueryRequest.tenant == tenant) & (QueryRequest.client_request_id == client_request_id)
        )

    def get_request(self, request_id: str) -> RequestView | None:
        return self._one_request(QueryRequest.request_id == request_id)

    def _one_request(self, condition: Any) -> RequestView | None:
        with self._autocommit.connect() as conn:
            row = conn.execute(
                select(
                    QueryRequest.request_id, QueryRequest.tenant, QueryRequest.client_request_id,
                    QueryRequest.query, QueryRequest.status, QueryRequest.created_at,
                    QueryRequest.updated_at, QueryRequest.deliveries, QueryRequest.runs,
                    QueryRequest.conversation_id, QueryRequest.standalone_query, QueryRequest.rewrite,
                ).where(condition)
            ).first()
        if row is None:
            return None
        return RequestView(
            row.request_id, row.tenant, row.client_request_id, row.query, RequestStatus(row.status),
            as_utc(row.created_at), as_utc(row.updated_at), row.deliveries or 0, row.runs or 0,
            row.conversation_id, row.standalone_query, row.rewrite,
        )

    def set_status(self, request_id: str, status: RequestStatus) -> None:
        """Move a request to `status`.

        `queued`/`running` only apply while the request is still in flight, so a redelivered task
        or a late front-door update never turns a finished request back into a running one; a
        request that never ran (`NEVER_RAN`) may be `queued` again when its client resends it.
        """
        status = RequestStatus(status)
        statement = update(QueryRequest).where(QueryRequest.request_id == request_id)
        if status in IN_FLIGHT:
            allowed = IN_FLIGHT | NEVER_RAN if status is RequestStatus.QUEUED else IN_FLIGHT
            statement = statement.where(QueryRequest.status.in_([s.value for s in allowed]))
        with self._autocommit.connect() as conn:  # the check below only explains a miss
            changed = conn.execute(statement.values(status=status.value, updated_at=utcnow())).rowcount
            if not changed and not conn.scalar(
                select(exists().where(QueryRequest.request_id == request_id))
            ):
                raise RequestNotFoundError(f"no request {request_id!r}")

    def begin_run(
        self, request_id: str, kind: ResultKind = ResultKind.PRIMARY, tenant: str | None = None,
    ) -> int | None:
        """Count one more delivery of the request's `kind` task that begins its run; returns the
        count, with this one. With `tenant` (a worker passes its task's), only that tenant's
        request is counted: another tenant's request id is unknown here (`RequestNotFoundError`),
        so a task naming a foreign id neither runs nor touches that request's counts.

        The primary run also moves the request to `running`, in the same conditional statement:
        only a request still in flight (`queued`, or `running` for a redelivery) begins. None
        when it is not: it never ran (`rejected`, `expired`: nothing runs it until its client
        resends it) or it finished meanwhile. A sweep expiring the request at the same moment
        and this call cannot both win. The count is durable, so a task whose run kills its
        whole worker is recognised however often the worker restarts. The same statement counts
        the primary run in `runs`, which nothing resets (no extra round trip).
        """
        params = {"b_request_id": request_id, "b_updated_at": utcnow(), "b_tenant": tenant}
        mine = QueryRequest.request_id == request_id
        if tenant is not None:
            mine &= QueryRequest.tenant == tenant
        with self._autocommit.connect() as conn:  # the check below only explains a miss
            count = conn.execute(self._hot.begin[ResultKind(kind)], params).scalar()
            if count is None and not conn.scalar(select(exists().where(mine))):
                raise RequestNotFoundError(f"no request {request_id!r}"
                                           + (f" for tenant {tenant!r}" if tenant is not None else ""))
        return count

    def expire_queued(self, older_than_s: float) -> list[str] | None:
        """Move every request `queued` for more than `older_than_s` (since it was admitted or
        re-admitted) to `expired`; returns their ids, or None when another process is sweeping.

        Such a request was never started: its message was lost, or not picked up before any
        client's deadline. The update is conditional on `queued`, so a worker that begins the run
        at the same moment wins (`begin_run`). On PostgreSQL one process sweeps at a time (an
        advisory lock: front door replicas do not sweep together); SQLite serves one machine and
        just sweeps.
        """
        if self.engine.dialect.name != "postgresql":
            return self._expire_queued(older_than_s)
        try:
            with advisory_lock(self.engine, EXPIRY_SWEEP_LOCK, SweepBusyError):
                return self._expire_queued(older_than_s)
        except SweepBusyError:
            return None

    def _expire_queued(self, older_than_s: float) -> list[str]:
        now = utcnow()
        statement = (
            update(QueryRequest)
            .where(QueryRequest.status == RequestStatus.QUEUED.value,
                   QueryRequest.updated_at < now - timedelta(seconds=older_than_s))
            .values(status=RequestStatus.EXPIRED.value, updated_at=now)
            .returning(QueryRequest.request_id)
        )
        with self.engine.begin() as conn:
            return list(conn.execute(statement).scalars())

    def readmit(self, request_id: str) -> bool:
        """Queue again a request its client resent, when it may run again: it never ran
        (`rejected`, `expired`) or its run ended with a retryable error (`dependency_unavailable`);
        False otherwise (it runs, it finished for good, or another front door re-admitted it
        first).

        One transaction, conditional on that state, so of two front doors re-admitting at once
        one wins. The retryable error's result row is deleted in it (the new run writes the one
        row the request has), and the delivery count starts again for the new run (`runs` keeps
        the earlier ones), as does its outbox mark (the caller publishes it; the relay if the
        caller dies first).
        """
        retryable = (QueryResult.request_id == request_id) & (
            QueryResult.kind == ResultKind.PRIMARY.value
        ) & QueryResult.error_code.in_([code.value for code in RETRYABLE_ERRORS])
        may_run_again = QueryRequest.status.in_([s.value for s in NEVER_RAN]) | (
            (QueryRequest.status == RequestStatus.ERROR.value) & exists().where(retryable)
        )
        with self.engine.begin() as conn:
            changed = conn.execute(
                update(QueryRequest)
                .where(QueryRequest.request_id == request_id, may_run_again)
                .values(status=RequestStatus.QUEUED.value, deliveries=0, enqueued_at=None,
                        updated_at=utcnow())
            ).rowcount
            if changed:
                conn.execute(delete(QueryResult).where(retryable))
        return bool(changed)

    # --- routing decisions ----------------------------------------------------------------------
    def record_decision(self, request_id: str, decision: RoutingDecision) -> None:
        """Store how the request was routed (one decision per request)."""
        try:
            with self.engine.begin() as conn:
                conn.execute(
                    self._insert(DecisionRow).values(
                        request_id=request_id, created_at=utcnow(),
                        **decision.model_dump(mode="json"),
                    )
                )
        except IntegrityError as exc:
            raise self._missing_or_duplicate(request_id, "routing decision") from exc

    def decision_for(self, request_id: str) -> RoutingDecision | None:
        with self._autocommit.connect() as conn:
            row = conn.execute(
                select(DecisionRow).where(DecisionRow.request_id == request_id)
            ).first()
        if row is None:
            return None
        return RoutingDecision(
            tier=Tier(row.tier), probabilities=row.probabilities, model_name=row.model_name or "",
            model_version=row.model_version, fallback=bool(row.fallback), reason=row.reason,
            strategy=row.strategy, classify_ms=row.classify_ms,
        )

    # --- results --------------------------------------------------------------------------------
    def save_result(self, result: AnswerResult, worker: str, attempts: int) -> bool:
        """Write a result once; True when this call wrote it, False when a row was already there.

        `INSERT ... ON CONFLICT (request_id, kind, tier) DO NOTHING`: whichever delivery of a task
        writes first wins, on SQLite and PostgreSQL alike. A primary result also finishes the
        request (`done`, or `error` with an error code) atomically: on PostgreSQL in the same
        statement (the update runs only when the insert wrote its row).
        """
        hot = self._hot
        now = utcnow()
        values = {**result.model_dump(mode="json"), "attempts": attempts, "worker": worker,
                  "created_at": now}
        params = {**{f"v_{k}": v for k, v in values.items()}, "f_request_id": result.request_id,
                  "f_updated_at": now,
                  "f_status": (RequestStatus.DONE if result.ok else RequestStatus.ERROR).value}
        primary = result.kind is ResultKind.PRIMARY
        try:
            if primary and hot.result_and_finish is not None:
                with self._autocommit.connect() as conn:
                    written = conn.execute(hot.result_and_finish, params).first() is not None
            elif not primary:
                with self._autocommit.connect() as conn:
                    written = conn.execute(hot.result, params).first() is not None
            else:
                with self.engine.begin() as conn:
                    written = conn.execute(hot.result, params).first() is not None
                    if written:
                        conn.execute(hot.finish, params)
        except IntegrityError as exc:  # the foreign key: no such request
            raise RequestNotFoundError(f"no request {result.request_id!r}") from exc
        return written

    def get_result(
        self, request_id: str, kind: ResultKind = ResultKind.PRIMARY, tier: Tier | None = None,
    ) -> AnswerResult | None:
        """The result of `kind` (and `tier`: a request has one shadow run per tier tried)."""
        stored = self.stored_result(request_id, kind, tier)
        return stored.result if stored else None

    def stored_result(
        self, request_id: str, kind: ResultKind = ResultKind.PRIMARY, tier: Tier | None = None,
    ) -> StoredResult | None:
        rows = self._results(request_id, kind, tier)
        return rows[0] if rows else None

    def shadow_results(self, request_id: str) -> list[StoredResult]:
        return self._results(request_id, ResultKind.SHADOW)

    def _results(
        self, request_id: str, kind: ResultKind, tier: Tier | None = None,
    ) -> list[StoredResult]:
        condition = (QueryResult.request_id == request_id) & (QueryResult.kind == ResultKind(kind).value)
        if tier is not None:
            condition &= QueryResult.tier == Tier(tier).value
        with self._autocommit.connect() as conn:
            rows = conn.execute(select(QueryResult).where(condition).order_by(QueryResult.id)).all()
        return [
            StoredResult(
                AnswerResult(
                    request_id=r.request_id, kind=ResultKind(r.kind), tier=Tier(r.tier),
                    strategy=r.strategy, answer=r.answer, steps=r.steps,
                    sources=tuple(Source(**s) for s in r.sources or ()),
                    timings=Timings(**(r.timings or {})), error=r.error,
                    error_code=ErrorCode(r.error_code) if r.error_code else None,
                    answerable=bool(r.answerable), abstain_reason=r.abstain_reason,
                    prompt_tokens=r.prompt_tokens or 0, completion_tokens=r.completion_tokens or 0,
                    cost=r.cost or 0.0,
                ),
                r.attempts, r.worker, as_utc(r.created_at),
            )
            for r in rows
        ]

    def count_results(self, request_id: str) -> int:
        """Rows of every kind for one request (what the exactly-once checks look at)."""
        with self.engine.connect() as conn:
            return conn.scalar(
                select(func.count()).select_from(QueryResult).where(
                    QueryResult.request_id == request_id
                )
            ) or 0

    # --- feedback -------------------------------------------------------------------------------
    def add_feedback(
        self, request_id: str, tenant: str, rating: int, correct_answer: str | None,
        comment: str | None,
    ) -> int:
        """Store a verdict on a request of `tenant`; returns the feedback id.

        Another tenant's request is reported exactly like an unknown one (`RequestNotFoundError`),
        so request ids cannot be probed across tenants.
        """
        if rating not in FEEDBACK_RATINGS:
            raise ValueError(f"rating must be one of -1, 0, 1 (wrong, no verdict, right), not {rating}")
        with self.engine.begin() as conn:
            owner = conn.scalar(
                select(QueryRequest.tenant).where(QueryRequest.request_id == request_id)
            )
            if owner is None or owner != tenant:
                raise RequestNotFoundError(f"no request {request_id!r} for tenant {tenant!r}")
            return conn.execute(
                self._insert(Feedback)
                .values(
                    request_id=request_id, tenant=tenant, rating=rating,
                    correct_answer=correct_answer, comment=comment, created_at=utcnow(),
                )
                .returning(Feedback.id)
            ).scalar_one()

    # --- helpers --------------------------------------------------------------------------------
    def _missing_or_duplicate(self, request_id: str, what: str) -> Exception:
        if self.get_request(request_id) is None:
            return RequestNotFoundError(f"no request {request_id!r}")
        return DuplicateRequestError(f"{what} of request {request_id!r} is already recorded")


__all__ = ["ApiKeyView", "RecordStore", "StoredResult", "SweepBusyError", "hash_key"]
