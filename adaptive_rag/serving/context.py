"""What every front-door use case works with: the ports, the settings, this process's state, and
the steps the use cases share (authenticate, the knowledge-base check, classify).

Records and broker calls block (SQLAlchemy, kombu); they run on a small thread pool (`Serving.io`)
so the event loop stays free, each with the call's context (its trace goes along).
"""

from __future__ import annotations

import asyncio
import contextvars
import functools
import random
import time
from collections import OrderedDict
from collections.abc import Callable, Coroutine, Hashable, Iterator, Mapping
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any, Generic, TypeVar

import structlog

from adaptive_rag.contracts import SMALL_TALK_MODEL, Principal, RoutingDecision, Scope, Tier
from adaptive_rag.errors import (
    ConversationNotFoundError, KnowledgeBaseMissingError, PermissionDeniedError, UnauthenticatedError,
)
from adaptive_rag.ports import LLM
from adaptive_rag.strategies.follow_up import Rewrite, RewriteMethod, Turn, standalone_question
from adaptive_rag.routing.rules import escalate_several_things
from adaptive_rag.routing.small_talk import small_talk_intent
from adaptive_rag.serving.ports import FairShare, Records, ResultWaiter, Router, TaskQueue
from adaptive_rag.serving.queue_delay import DepthEstimate, QueueDelayGate
from adaptive_rag.strategies import SMALL_TALK
from adaptive_rag.tracing import span

LOG = structlog.get_logger("serving")
# Threads for the blocking records and broker calls (one hop per admission); see the front
# door's `io_threads` setting for why four.
IO_THREADS = 4
T = TypeVar("T")
V = TypeVar("V")


@dataclass(frozen=True)
class AdmissionConfig:
    """What the use cases need to know; the front door builds it from its settings once.

    `key_cache_s`: how long a known API key's tenant is remembered (0: ask the records every
    time). A revoked key is forgotten sooner when the front door watches the key table
    (`upkeep.drop_revoked_keys`); without that watch it keeps working that long on a replica that
    saw it. The same time bounds how long a tenant's knowledge base is taken to exist once seen.
    """

    max_query_chars: int
    max_queue_depth: Mapping[Tier, int]
    strategy_for: Callable[[Tier], str]
    shadow_share: float = 0.0
    key_cache_s: float = 0.0
    small_talk: bool = True
    two_questions_to_c: bool = True  # a query asking several things goes to C (`rules.escalate_several_things`)
    # How long a fair-share slot may stay held by work still running (the tier's lease).
    slot_lease_s: Mapping[Tier, float] = field(default_factory=dict)
    # A request still queued this long was never started: `expire_stale` expires it (None: never).
    queued_expiry_s: float | None = None
    # A request still queued, never marked published and unchanged this long lost its publish:
    # `upkeep.relay_unpublished` publishes it again (None: never).
    unpublished_after_s: float | None = None
    # A request published this long ago and never delivered is looked for in the broker; when the
    # broker holds it nowhere, `upkeep.republish_lost` publishes it again (None: never).
    lost_after_s: float | None = None
    # Wait budget per tier (`queue_delay.QueueDelayGate`); a tier left out is limited by length only.
    queue_wait_target_s: Mapping[Tier, float] = field(default_factory=dict)
    queue_wait_interval_s: float = 1.0
    # How old a tier queue's depth read may be before an admission reads it again
    # (`queue_delay.DepthEstimate`; 0: read on every admission).
    depth_max_age_s: float = 0.0
    io_threads: int = IO_THREADS
    # Conversations: how many earlier turns a follow-up is rewritten against, and how long a
    # turn counts (a conversation whose turns are all older is not found: start a new one).
    conversation_turns: int = 3
    conversation_retention_s: float = 86_400.0


class TtlCache(Generic[V]):
    """Recently confirmed facts (the principal of a known API key, a tenant that has a knowledge
    base), each kept `ttl_s`. Only positive answers go in: an unknown key is always looked up,
    so guessing keys cannot fill the cache, and a new knowledge base is seen at once.

    `clear` forgets everything and starts a new `generation`: a value looked up before the clear
    and put after it (`put(..., generation)` with the generation read before the look-up) is
    dropped, so a look-up racing a revocation cannot put the revoked key back."""

    def __init__(self, ttl_s: float, max_items: int = 10_000,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.ttl_s = ttl_s
        self.max_items = max_items
        self._clock = clock
        self._items: OrderedDict[str, tuple[V, float]] = OrderedDict()
        self.generation = 0

    def get(self, key: str) -> V | None:
        found = self._items.get(key)
        if found is None:
            return None
        value, expires = found
        if self._clock() >= expires:
            del self._items[key]
            return None
        return value

    def put(self, key: str, value: V, generation: int | None = None) -> None:
        """Remember `value`; with `generation` only while no `clear` came since it was read."""
        if self.ttl_s <= 0 or (generation is not None and generation != self.generation):
            return
        self._items[key] = (value, self._clock() + self.ttl_s)
        self._items.move_to_end(key)
        while len(self._items) > self.max_items:
            self._items.popitem(last=False)

    def clear(self) -> None:
        self._items.clear()
        self.generation += 1


@dataclass
class CallProgress:
    """What one call learned so far; the edge reads it for metrics, logs and trailing metadata
    even when the call ends in an error. `stages` holds milliseconds per stage of the call
    (authenticate, validate, idempotency, classify, record, admit, enqueue, wait)."""

    request_id: str | None = None
    tier: Tier | None = None
    stages: dict[str, float] = field(default_factory=dict)

    def bind(self, **values: Any) -> None:
        if "request_id" in values:
            self.request_id = values["request_id"]
        structlog.contextvars.bind_contextvars(**values)

    @contextmanager
    def stage(self, name: str) -> Iterator[None]:
        """Time the stage (and trace it: a `serving.<name>` span of the call's trace)."""
        start = time.perf_counter()
        try:
            with span(f"serving.{name}"):
                yield
        finally:
            self.stages[name] = self.stages.get(name, 0.0) + 1000 * (time.perf_counter() - start)


class Serving:
    """The ports, the settings and this process's state every use case shares: the API-key and
    knowledge-base caches, the queue wait gate and depth reads, the I/O threads and the
    background watchers. The `on_*` hooks tell the edge's metrics what happened."""

    def __init__(
        self, records: Records, queue: TaskQueue, waiter: ResultWaiter, router: Router,
        config: AdmissionConfig, has_knowledge_base: Callable[[str], bool],
        fair_share: FairShare | None = None, sample: Callable[[], float] = random.random,
        on_routed: Callable[[RoutingDecision], None] = lambda decision: None,
        on_rejected: Callable[[Tier], None] = lambda tier: None,
        on_queue_depth: Callable[[str, int], None] = lambda queue, depth: None,
        on_expired: Callable[[int], None] = lambda count: None,
        on_republished: Callable[[int], None] = lambda count: None,
        on_recorded: Callable[[str], None] = lambda request_id: None,
        rewriter: LLM | None = None,
    ) -> None:
        """`on_recorded(request_id)`: called on the I/O thread once a new request's row is
        committed, before its task is enqueued (the front door's fault injection uses it).
        `rewriter`: the reader that rewrites follow-ups no rule fits (None: rules only)."""
        self.records = records
        self.queue = queue
        self.waiter = waiter
        self.router = router
        self.config = config
        self.fair_share = fair_share
        self.sample = sample  # draws the shadow-run share
        self.on_routed = on_routed
        self.on_rejected = on_rejected
        self.on_queue_depth = on_queue_depth
        self.on_expired = on_expired
        self.on_republished = on_republished
        self.on_recorded = on_recorded
        self.rewriter = rewriter
        self._has_knowledge_base = has_knowledge_base
        self._io_pool = ThreadPoolExecutor(config.io_threads, thread_name_prefix="serving-io")
        # The outbox marks (`mark_enqueued_soon`): their own thread, which `close` lets finish.
        self._marks = ThreadPoolExecutor(1, thread_name_prefix="serving-mark")
        self.delay_gate = QueueDelayGate(config.queue_wait_target_s, config.queue_wait_interval_s)
        self.depths = DepthEstimate(config.depth_max_age_s)
        self._keys: TtlCache[Principal] = TtlCache(config.key_cache_s)
        self._keys_revision: Hashable | None = None  # the key table's, when the cache was last dropped
        self._knowledge: TtlCache[bool] = TtlCache(config.key_cache_s)
        self._watchers: set[asyncio.Task] = set()

    def close(self) -> None:
        for watcher in list(self._watchers):
            watcher.cancel()
        self._io_pool.shutdown(wait=False, cancel_futures=True)
        self._marks.shutdown(wait=False)  # marks already submitted still run

    async def io(self, fn: Callable[..., T], *args: Any) -> T:
        """A short blocking call (records, broker) off the event loop. The adapters raise the
        library's errors (`DependencyUnavailableError` when their service does not answer)."""
        loop = asyncio.get_running_loop()
        # The call's context goes along (its trace: an enqueue carries it in the task's headers).
        context = contextvars.copy_context()
        return await loop.run_in_executor(self._io_pool, functools.partial(context.run, fn, *args))

    def io_soon(self, fn: Callable[..., object], *args: Any) -> None:
        """`fn(*args)` on an I/O thread, not awaited (dropped while shutting down)."""
        try:
            self._io_pool.submit(fn, *args)
        except RuntimeError:  # shutting down
            pass

    def mark_enqueued_soon(self, request_id: str) -> None:
        """Mark the request's task published (`Records.mark_enqueued`) on the mark thread, not
        awaited: the call goes on to wait for its answer meanwhile. A mark that fails or never
        runs costs a second publish by the relay (harmless), never the request."""
        try:
            self._marks.submit(self._mark_enqueued, request_id)
        except RuntimeError:  # shut down: marked now
            self._mark_enqueued(request_id)

    def _mark_enqueued(self, request_id: str) -> None:
        try:
            self.records.mark_enqueued(request_id)
        except Exception as exc:  # noqa: BLE001 - the relay publishes it again
            LOG.warning("mark_enqueued_failed", request_id=request_id, error=str(exc))

    def watch(self, work: Coroutine[Any, Any, None], name: str) -> None:
        """Run `work` in the background until it ends (or `close`)."""
        watcher = asyncio.get_running_loop().create_task(work, name=name)
        self._watchers.add(watcher)
        watcher.add_done_callback(self._watchers.discard)

    async def authenticate(self, api_key: str, progress: CallProgress, scope: Scope | None = None) -> Principal:
        """The caller's tenant and scopes; with `scope`, a key without it is refused."""
        with progress.stage("authenticate"):
            principal = self._keys.get(api_key)
            if principal is None:
                generation = self._keys.generation
                principal = await self.io(self.records.principal_for_key, api_key)
                if principal is not None:
                    self._keys.put(api_key, principal, generation)
        if principal is None:
            raise UnauthenticatedError("unknown or revoked API key")
        progress.bind(tenant=principal.tenant)
        if scope is not None and not principal.allows(scope):
            granted = ", ".join(sorted(s.value for s in principal.scopes))
            raise PermissionDeniedError(f"this API key may not {scope.value!r} (its scopes: {granted})")
        return principal

    def keys_changed(self, revision: Hashable) -> bool:
        """Forget every cached API key when the key table's `revision` differs from the one seen
        last (or none was seen yet: a key cached before the first look may be revoked already);
        whether it did. A forgotten key costs one records look-up on its next call."""
        if revision == self._keys_revision:
            return False
        self._keys_revision = revision
        self._keys.clear()
        return True

    async def require_knowledge_base(self, tenant: str) -> None:
        if self._knowledge.get(tenant):
            return
        if not await self.io(self._has_knowledge_base, tenant):
            raise KnowledgeBaseMissingError(
                f"tenant {tenant!r} has no knowledge base yet: import its documents first "
                "(KnowledgeBase.UpsertDocuments, or `arag kb import --tenant ...`)"
            )
        self._knowledge.put(tenant, True)

    async def follow_up(self, query: str, tenant: str, conversation_id: str | None,
                        progress: CallProgress) -> Rewrite:
        """`query` as a question that stands alone within `tenant`'s conversation (as sent
        without one); `ConversationNotFoundError` for a conversation the tenant does not have
        within the retention. A turn that is small talk on its own is never rewritten ("thanks
        for that" stays a thanks)."""
        if conversation_id is None:
            return Rewrite(query, RewriteMethod.NONE)
        with progress.stage("conversation"):
            since = datetime.now(UTC) - timedelta(seconds=self.config.conversation_retention_s)
            turns = await self.io(self.records.conversation_turns, tenant, conversation_id, since,
                                  self.config.conversation_turns)
            if turns is None:
                raise ConversationNotFoundError(
                    f"no conversation {conversation_id!r} of tenant {tenant!r} in the last "
                    f"{self.config.conversation_retention_s:g} s")
            if self.config.small_talk and small_talk_intent(query) is not None:
                return Rewrite(query, RewriteMethod.NONE)
            history = [Turn(t.question, t.answer) for t in turns]
            return await self.io(standalone_question, query, history, self.rewriter)

    async def classify(self, query: str, tenant: str, progress: CallProgress) -> RoutingDecision:
        """The router's decision for `tenant` (its prior, if any, shifts the classifier's) with
        the strategy and the time it took (not yet recorded).

        A small-talk turn ("hi", "thanks!", "are you a bot?") is tier A without asking the
        classifier, answered by the small-talk strategy (a short reply, no retrieval, no LLM). A
        query asking several things goes to C whatever the router says (`escalate_several_things`).
        """
        start = time.perf_counter()
        with progress.stage("classify"):
            chat = small_talk_intent(query) if self.config.small_talk else None
            if chat is not None:
                routed = RoutingDecision(tier=Tier.A, model_name=SMALL_TALK_MODEL,
                                         reason=f"small talk ({chat.intent})", strategy=SMALL_TALK)
            else:
                routed = await self.router.route(query, tenant)
                if self.config.two_questions_to_c:
                    routed = escalate_several_things(query, routed)
        decision = routed.model_copy(update={
            "strategy": routed.strategy or self.config.strategy_for(routed.tier),
            "classify_ms": 1000 * (time.perf_counter() - start),
        })
        progress.tier = decision.tier
        return decision

    def routed(self, decision: RoutingDecision) -> None:
        """Count and log a decision once it is recorded (a replay's unused one is not)."""
        self.on_routed(decision)
        LOG.info("routed", tier=decision.tier.value, fallback=decision.fallback,
                 model_version=decision.model_version, classify_ms=round(decision.classify_ms, 2),
                 reason=decision.reason)
