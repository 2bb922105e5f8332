"""The front door's settings, read once when it starts (environment or `.env`)."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

from pydantic import Field, field_validator, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from adaptive_rag.contracts import Tier
from adaptive_rag.serving.context import IO_THREADS
from adaptive_rag.settings import env_name

DEFAULT_QUEUE_LIMITS = {Tier.A: 500, Tier.B: 200, Tier.C: 100}
# A tenant's share of each tier queue: half of it, so two busy tenants can always both run.
DEFAULT_TENANT_SLOTS = {tier: limit // 2 for tier, limit in DEFAULT_QUEUE_LIMITS.items()}
DEFAULT_TENANT_LEASES = {Tier.A: 120.0, Tier.B: 300.0, Tier.C: 600.0}


class FrontDoorSettings(BaseSettings):
    """Listening address, metrics, admission limits, waiting and shadow sampling."""

    model_config = SettingsConfigDict(env_file=".env", extra="ignore", populate_by_name=True)

    grpc_listen: str = Field("127.0.0.1:50051", validation_alias=env_name("ARAG_GRPC_LISTEN", "grpc_listen"))
    # TLS on the gRPC port: a PEM certificate chain and its private key (both or neither; neither
    # is plaintext, what the demo and the load runs use on loopback). With `tls_client_ca` too,
    # mutual TLS: a client must present a certificate signed by that CA.
    tls_cert: Path | None = Field(None, validation_alias=env_name("ARAG_TLS_CERT", "tls_cert"))
    tls_key: Path | None = Field(None, validation_alias=env_name("ARAG_TLS_KEY", "tls_key"))
    tls_client_ca: Path | None = Field(None, validation_alias=env_name("ARAG_TLS_CLIENT_CA", "tls_client_ca"))
    # Server reflection (grpcurl without the .proto): on for local use, off in production
    # (compose and k8s set false) so the API's shape is not handed to anyone who connects.
    grpc_reflection: bool = Field(True, validation_alias=env_name("ARAG_GRPC_REFLECTION", "grpc_reflection"))
    # Prometheus exporter (HTTP /metrics); 0 switches it off.
    metrics_port: int = Field(9108, ge=0, validation_alias=env_name("ARAG_METRICS_PORT", "metrics_port"))
    # Queued tasks a tier may hold before new queries routed to it get RESOURCE_EXHAUSTED, as JSON
    # (`ARAG_MAX_QUEUE_DEPTH='{"C": 50}'`); tiers left out keep their default.
    max_queue_depth: dict[Tier, int] = Field(
        default_factory=lambda: dict(DEFAULT_QUEUE_LIMITS),
        validation_alias=env_name("ARAG_MAX_QUEUE_DEPTH", "max_queue_depth"),
    )
    # Wait budget per tier, as JSON (`ARAG_QUEUE_WAIT_TARGET='{"A": 1.0}'`, seconds): when even the
    # shortest queue wait of the tier's tasks finished in the last `queue_wait_interval_s` exceeds
    # it, the queue stands and new queries for the tier get RESOURCE_EXHAUSTED
    # (`adaptive_rag.serving.queue_delay`); tiers left out (the default: all) are limited by length only.
    queue_wait_target_s: dict[Tier, float] = Field(
        default_factory=dict, validation_alias=env_name("ARAG_QUEUE_WAIT_TARGET", "queue_wait_target_s"),
    )
    queue_wait_interval_s: float = Field(
        1.0, gt=0, validation_alias=env_name("ARAG_QUEUE_WAIT_INTERVAL", "queue_wait_interval_s")
    )
    # How old a tier queue's depth may be when an admission checks it against the limit: read
    # again past it, and in between the last read plus what this replica queued since
    # (`adaptive_rag.serving.queue_delay.DepthEstimate`; 0: one broker read per admission).
    queue_depth_max_age_s: float = Field(
        0.05, ge=0, validation_alias=env_name("ARAG_QUEUE_DEPTH_MAX_AGE", "queue_depth_max_age_s")
    )
    # Threads for the blocking records and broker calls: every admission makes one hop to them,
    # each a few round trips long. Four keep up at this machine's ceiling and spend 6 % less of
    # the front door's CPU than sixteen at 16 clients (fewer threads waiting for the GIL;
    # reports/load/frontdoor-io-threads).
    io_threads: int = Field(
        IO_THREADS, ge=1, le=256, validation_alias=env_name("ARAG_FRONTDOOR_IO_THREADS", "io_threads")
    )
    # Conversations: how many earlier turns a follow-up is rewritten against.
    conversation_turns: int = Field(
        3, ge=1, le=20, validation_alias=env_name("ARAG_CONVERSATION_TURNS", "conversation_turns")
    )
    # How long (seconds) a conversation's turns count: a conversation whose turns are all older
    # answers NOT_FOUND (the client starts a new one). The turns stay in the records.
    conversation_retention_s: float = Field(
        86_400.0, gt=0, validation_alias=env_name("ARAG_CONVERSATION_RETENTION", "conversation_retention_s")
    )
    # Who rewrites a follow-up no rule fits: "auto" the reader when it is an endpoint
    # (LLM_BASE_URL: one HTTP call), never an embedded model loaded into the front door; "reader"
    # the configured reader whatever it is; "rules" the rules only (the previous topic added).
    rewrite_with: Literal["auto", "reader", "rules"] = Field(
        "auto", validation_alias=env_name("ARAG_REWRITE_WITH", "rewrite_with")
    )
    # The event loop the server runs on: uvloop (libuv; less work per call on the loop) or
    # asyncio's own.
    event_loop: Literal["uvloop", "asyncio"] = Field(
        "uvloop", validation_alias=env_name("ARAG_EVENT_LOOP", "event_loop")
    )
    # How long Answer waits when the client sent no deadline.
    default_wait_s: float = Field(60.0, gt=0, validation_alias=env_name("ARAG_DEFAULT_WAIT", "default_wait_s"))
    # Kept free of the client's deadline so DEADLINE_EXCEEDED is ours, sent before the client's (with
    # the request id trailer); 0.2 s was too little for a front door on a loaded machine.
    deadline_margin_s: float = Field(
        0.5, ge=0, validation_alias=env_name("ARAG_DEADLINE_MARGIN", "deadline_margin_s")
    )
    # Share of live queries also run on the neighbouring tier in the `shadow` queue (unbiased labels).
    shadow_share: float = Field(
        0.0, ge=0.0, le=1.0, validation_alias=env_name("ARAG_SHADOW_SHARE", "shadow_share")
    )
    # Which router decides the tier (see services/frontdoor/routing.py): the Triton classifier,
    # the question-form rules, a learned router (lr, knn, reward; from `router_dir`, default
    # var/routers/<kind>), the LLM judge, or a self-routing strategy (self-route: B first, C when the
    # reader abstains; uncertainty: A first, B when the draft is unsure).
    router: Literal["classifier", "rules", "lr", "knn", "reward", "llm-judge", "self-route", "uncertainty"] = Field(
        "classifier", validation_alias=env_name("ARAG_ROUTER", "router")
    )
    router_dir: Path | None = Field(None, validation_alias=env_name("ARAG_ROUTER_DIR", "router_dir"))
    # How often the front door looks for a newly published classifier version.
    model_poll_s: float = Field(10.0, gt=0, validation_alias=env_name("ARAG_MODEL_POLL", "model_poll_s"))
    # How long a known API key's tenant is remembered before the records are asked again; 0 asks
    # every time. A revoked key is forgotten sooner by the revocation watch below; with the watch
    # off, or while the records do not answer it, a revoked key keeps working up to this long on a
    # replica that saw it.
    key_cache_s: float = Field(30.0, ge=0, validation_alias=env_name("ARAG_KEY_CACHE", "key_cache_s"))
    # How often a front door reads the key table's revision (one small aggregate query) and forgets
    # its cached keys when a key was revoked, by whichever process: a revoked key is refused on
    # every replica within about this long plus one query. 0 switches the watch off.
    key_revocation_s: float = Field(
        1.0, ge=0, validation_alias=env_name("ARAG_KEY_REVOCATION", "key_revocation_s")
    )
    # Repeated queries routed without a Triton round trip (per model version; 0 switches it off).
    routing_cache: int = Field(10_000, ge=0, validation_alias=env_name("ARAG_ROUTING_CACHE", "routing_cache"))
    # The retry-after hint (seconds, trailing metadata) of an UNAVAILABLE reply: about how long a
    # broker or database restart takes.
    unavailable_retry_s: float = Field(
        2.0, ge=0, validation_alias=env_name("ARAG_UNAVAILABLE_RETRY", "unavailable_retry_s")
    )
    # Health also pings the workers (Celery's control ping) on its cycle and says NOT_SERVING
    # when none answers within `worker_ping_timeout_s`.
    health_workers: bool = Field(True, validation_alias=env_name("ARAG_HEALTH_WORKERS", "health_workers"))
    worker_ping_timeout_s: float = Field(
        1.0, gt=0, validation_alias=env_name("ARAG_WORKER_PING_TIMEOUT", "worker_ping_timeout_s")
    )
    # A request still `queued` this long after it was admitted (or admitted again) was never
    # started: its message was lost, or no worker reached it before its client's deadline. The
    # sweep moves it to `expired` (GetResult: "never ran; send the Answer again"; a resend with its
    # client_request_id runs it under the same request id, and a worker that reaches its old
    # message without a resend does not run it). Keep it above the longest deadline clients use
    # plus a grace: 10 min covers the default wait (60 s) and a tier-C client waiting minutes.
    queued_expiry_s: float = Field(
        600.0, gt=0, validation_alias=env_name("ARAG_QUEUED_EXPIRY", "queued_expiry_s")
    )
    # How often a front door sweeps for such requests (one replica at a time on PostgreSQL);
    # 0 switches the sweep off.
    expiry_sweep_s: float = Field(
        30.0, ge=0, validation_alias=env_name("ARAG_EXPIRY_SWEEP", "expiry_sweep_s")
    )
    # A request still `queued` this long after it was written (or admitted again) whose task was
    # never marked published lost its publish (its front door died between the record and the
    # enqueue): every front door's relay publishes it again. Keep it above the time an admission
    # takes from its insert to its publish (milliseconds); a second publish is harmless (one
    # result is written).
    unpublished_after_s: float = Field(
        5.0, gt=0, validation_alias=env_name("ARAG_UNPUBLISHED_AFTER", "unpublished_after_s")
    )
    # How often a front door runs that relay (also once at start-up); 0 switches it off.
    relay_every_s: float = Field(
        2.0, ge=0, validation_alias=env_name("ARAG_RELAY_EVERY", "relay_every_s")
    )
    # A request published this long ago and still never delivered to a worker is looked for in
    # the broker; one it holds nowhere (a worker host took the message and died before recording
    # it) is published again. Keep it above the broker's hand-over time (milliseconds); a second
    # publish is harmless (one result is written).
    lost_after_s: float = Field(
        10.0, gt=0, validation_alias=env_name("ARAG_LOST_AFTER", "lost_after_s")
    )
    # How often a front door looks for such requests; 0 switches the check off. Each look reads
    # the waiting messages of every queue once, and only when some request is that old.
    lost_check_every_s: float = Field(
        5.0, ge=0, validation_alias=env_name("ARAG_LOST_CHECK_EVERY", "lost_check_every_s")
    )
    # TEST ONLY, never in production: the process exits (`os._exit`, no clean-up) right after a
    # new request's row is committed and before its task is enqueued, to show the relay and a
    # resend recover such a request (tests/integration/test_stranded_request.py).
    fault_exit_after_record: bool = Field(
        False, validation_alias=env_name("ARAG_FAULT_EXIT_AFTER_RECORD", "fault_exit_after_record")
    )
    # Threads that wait on results when the result backend is not Redis (each waiting Answer holds
    # one); with Redis, waits share one pub/sub connection on the event loop instead.
    wait_threads: int = Field(
        64, ge=1, validation_alias=env_name("ARAG_FRONTDOOR_WAIT_THREADS", "wait_threads")
    )

    # --- fair share between tenants (per tenant: a token bucket over all tiers, and slots = the
    # queued + running tasks it may hold per tier). Shared through Redis when REDIS_URL is set,
    # else kept in this process. 0 = unlimited.
    redis_url: str | None = Field(None, validation_alias=env_name("REDIS_URL", "redis_url"))
    tenant_rate_per_s: float = Field(
        50.0, ge=0, validation_alias=env_name("ARAG_TENANT_RATE", "tenant_rate_per_s")
    )
    tenant_burst: int = Field(100, ge=1, validation_alias=env_name("ARAG_TENANT_BURST", "tenant_burst"))
    tenant_slots: dict[Tier, int] = Field(
        default_factory=lambda: dict(DEFAULT_TENANT_SLOTS),
        validation_alias=env_name("ARAG_TENANT_SLOTS", "tenant_slots"),
    )
    # A slot never given back (the client's deadline passed before the answer) ends after this:
    # the tier's worker time limit plus a margin.
    tenant_lease_s: dict[Tier, float] = Field(
        default_factory=lambda: dict(DEFAULT_TENANT_LEASES),
        validation_alias=env_name("ARAG_TENANT_LEASE", "tenant_lease_s"),
    )
    # The retry-after hint when a tenant's slots on a tier are full (about one run of the tier).
    tenant_slot_retry_s: dict[Tier, float] = Field(
        default_factory=lambda: {Tier.A: 1.0, Tier.B: 2.0, Tier.C: 5.0},
        validation_alias=env_name("ARAG_TENANT_SLOT_RETRY", "tenant_slot_retry_s"),
    )
    # Per-tenant overrides as JSON: '{"acme": {"rate_per_s": 5, "burst": 10, "slots": {"C": 1}}}'.
    tenant_limits: dict[str, dict[str, Any]] = Field(
        default_factory=dict, validation_alias=env_name("ARAG_TENANT_LIMITS", "tenant_limits")
    )

    @field_validator("tls_cert", "tls_key", "tls_client_ca", mode="before")
    @classmethod
    def _unset_when_empty(cls, value: Any) -> Any:
        """`ARAG_TLS_CERT=` (a compose file's `${VAR:-}`) means no file, not the current folder."""
        return None if isinstance(value, str) and not value.strip() else value

    @model_validator(mode="after")
    def _tls_pairs(self) -> FrontDoorSettings:
        if (self.tls_cert is None) != (self.tls_key is None):
            raise ValueError("ARAG_TLS_CERT and ARAG_TLS_KEY go together: set both, or neither for plaintext")
        if self.tls_client_ca is not None and self.tls_cert is None:
            raise ValueError("ARAG_TLS_CLIENT_CA (mutual TLS) needs ARAG_TLS_CERT and ARAG_TLS_KEY")
        return self

    @property
    def tls(self) -> bool:
        return self.tls_cert is not None

    @field_validator("tenant_slots", mode="after")
    @classmethod
    def _slots_for_every_tier(cls, slots: dict[Tier, int]) -> dict[Tier, int]:
        if any(n < 0 for n in slots.values()):
            raise ValueError(f"tenant slots must be >= 0: {slots}")
        return {**DEFAULT_TENANT_SLOTS, **slots}

    @field_validator("tenant_lease_s", mode="after")
    @classmethod
    def _lease_for_every_tier(cls, leases: dict[Tier, float]) -> dict[Tier, float]:
        if any(s <= 0 for s in leases.values()):
            raise ValueError(f"tenant leases must be > 0 s: {leases}")
        return {**DEFAULT_TENANT_LEASES, **leases}

    @field_validator("queue_wait_target_s", mode="after")
    @classmethod
    def _wait_targets(cls, targets: dict[Tier, float]) -> dict[Tier, float]:
        if any(target < 0 for target in targets.values()):
            raise ValueError(f"queue wait targets must be >= 0 s (0: none): {targets}")
        return targets

    @field_validator("max_queue_depth", mode="after")
    @classmethod
    def _every_tier(cls, limits: dict[Tier, int]) -> dict[Tier, int]:
        if any(limit < 0 for limit in limits.values()):
            raise ValueError(f"queue limits must be >= 0: {limits}")
        return {**DEFAULT_QUEUE_LIMITS, **limits}
