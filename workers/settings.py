"""The workers' settings, read once per process (environment or `.env`): broker, pools, limits,
retries. Per-tier and per-pool values are mappings, e.g. `ARAG_CONCURRENCY='{"A": 4}'`; keys
left out keep their defaults."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import Field, field_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from adaptive_rag.contracts import TIERS, Tier
from adaptive_rag.settings import env_name

Pool = Literal["A", "B", "C", "shadow", "shared"]
# Worker processes per pool and messages each reserves ahead (C: 1, a long task must not hold
# back queued ones that another worker could start).
DEFAULT_CONCURRENCY: dict[str, int] = {"A": 2, "B": 2, "C": 1, "shadow": 1}
DEFAULT_PREFETCH: dict[str, int] = {"A": 4, "B": 2, "C": 1, "shadow": 1}
DEFAULT_TIME_LIMITS: dict[Tier, float] = {Tier.A: 60.0, Tier.B: 120.0, Tier.C: 300.0}


class WorkerSettings(BaseSettings):
    """Celery broker and result backend, pool sizes, time limits, redelivery and retries."""

    model_config = SettingsConfigDict(env_file=".env", extra="ignore", populate_by_name=True)

    # Celery broker and result backend; unset: a filesystem broker under `broker_dir` (no server).
    # With Sentinel: `sentinel://h1:26379,h2:26379,h3:26379/0?master_name=NAME` (the primary the
    # Sentinels name, followed across a failover; see docs/operating.md "Failover").
    redis_url: str | None = Field(None, validation_alias=env_name("REDIS_URL", "redis_url"))
    broker_dir: Path = Field(Path("var/broker"), validation_alias=env_name("ARAG_BROKER_DIR", "broker_dir"))
    concurrency: dict[str, int] = Field(
        default_factory=lambda: dict(DEFAULT_CONCURRENCY),
        validation_alias=env_name("ARAG_CONCURRENCY", "concurrency"),
    )
    prefetch: dict[str, int] = Field(
        default_factory=lambda: dict(DEFAULT_PREFETCH), validation_alias=env_name("ARAG_PREFETCH", "prefetch")
    )
    # Soft time limit per tier (the task records a `time_limit` error); the hard limit, which kills
    # the worker process, comes `time_limit_grace_s` later.
    time_limit_s: dict[Tier, float] = Field(
        default_factory=lambda: dict(DEFAULT_TIME_LIMITS),
        validation_alias=env_name("ARAG_TIME_LIMIT", "time_limit_s"),
    )
    time_limit_grace_s: float = Field(
        15.0, gt=0, validation_alias=env_name("ARAG_TIME_LIMIT_GRACE", "time_limit_grace_s")
    )
    # Redis broker: a message reserved by a worker that died is delivered again after this long.
    # Keep it above the longest C run (hard limit), or a slow task also runs a second time. A
    # worker process or host that died is noticed sooner, by its consumer lease below.
    visibility_timeout_s: float = Field(
        900.0, gt=0, validation_alias=env_name("ARAG_VISIBILITY_TIMEOUT", "visibility_timeout_s")
    )
    # How long a finished task's result stays in the result backend (Redis: a key with this time
    # to live) for the front doors waiting on it; the records database keeps every answer. Keep
    # it above the longest Answer wait (the default 60 s, a client deadline of minutes).
    result_ttl_s: float = Field(
        900.0, ge=60, validation_alias=env_name("ARAG_RESULT_TTL", "result_ttl_s")
    )
    # Redis broker: each worker's consumer renews a lease every quarter of this; the messages
    # reserved by one whose lease ran out (its process or host died, or it was cut off from the
    # broker this long) are put back on their queues by the other workers' next sweep (every
    # `consumer_lease_s / 2`). A worker only cut off may then run a task another runs too (one
    # result is written): keep it above the broker hiccups you expect.
    consumer_lease_s: float = Field(
        10.0, ge=2, validation_alias=env_name("ARAG_CONSUMER_LEASE", "consumer_lease_s")
    )
    # Transient failures (retriever or LLM unreachable, index missing) retried with exponential
    # backoff from `task_retry_backoff_s`, each wait capped at `task_retry_max_backoff_s`; after the
    # last retry the error is recorded as the result, and that stored error is what every resend
    # of the request replays. 10 retries from 1 s capped at 4 s span about 35 s, so a dependency's
    # restart (an OpenSearch node: ~20 s) costs delay, not answers, and the first try after it is
    # back comes within 4 s (an uncapped doubling waited up to 16 s more).
    task_max_retries: int = Field(10, ge=0, validation_alias=env_name("ARAG_TASK_MAX_RETRIES", "task_max_retries"))
    task_retry_backoff_s: float = Field(
        1.0, ge=0, validation_alias=env_name("ARAG_TASK_RETRY_BACKOFF", "task_retry_backoff_s")
    )
    task_retry_max_backoff_s: float = Field(
        4.0, gt=0, validation_alias=env_name("ARAG_TASK_RETRY_MAX_BACKOFF", "task_retry_max_backoff_s")
    )
    # A message whose run kills its whole worker (the OOM killer, a native crash of the main
    # process) comes back after every restart. Each delivery that begins a run is counted in its
    # request's record; one message begun more often than this (its retries are new messages and
    # not counted) records an `internal` error instead of running again. Unset: `max_deliveries`.
    task_max_deliveries: int | None = Field(
        None, ge=1, validation_alias=env_name("ARAG_TASK_MAX_DELIVERIES", "task_max_deliveries")
    )
    # Comparison setup (lab/experiments/queue_isolation.py): every tier's primary task goes to ONE
    # queue, `shared`, served by one pool with the tier pools' total concurrency and prefetch 1.
    shared_queue: bool = Field(False, validation_alias=env_name("ARAG_SHARED_QUEUE", "shared_queue"))
    # Prometheus `/metrics` of each pool (`workers.metrics`): on this port + the pool's offset
    # (A 0, B 1, C 2, shadow 3, shared 4); 0 switches it off. The pool's processes share their
    # samples through files under `worker_metrics_dir`.
    worker_metrics_port: int = Field(
        0, ge=0, validation_alias=env_name("ARAG_WORKER_METRICS_PORT", "worker_metrics_port"))
    worker_metrics_dir: Path = Field(
        Path("var/metrics"), validation_alias=env_name("ARAG_WORKER_METRICS_DIR", "worker_metrics_dir"))
    # Loopback unless a scraper elsewhere reads it (the deploy files: 0.0.0.0).
    worker_metrics_addr: str = Field(
        "127.0.0.1", validation_alias=env_name("ARAG_WORKER_METRICS_ADDR", "worker_metrics_addr"))

    @field_validator("concurrency", "prefetch", mode="after")
    @classmethod
    def _pools(cls, values: dict[str, int], info) -> dict[str, int]:
        defaults = DEFAULT_CONCURRENCY if info.field_name == "concurrency" else DEFAULT_PREFETCH
        unknown = set(values) - set(defaults)
        if unknown:
            raise ValueError(f"unknown pool(s) {sorted(unknown)}; pools are {sorted(defaults)}")
        if any(v < 1 for v in values.values()):
            raise ValueError(f"{info.field_name} values must be >= 1: {values}")
        return {**defaults, **values}

    @field_validator("time_limit_s", mode="after")
    @classmethod
    def _limits(cls, values: dict[Tier, float]) -> dict[Tier, float]:
        if any(v <= 0 for v in values.values()):
            raise ValueError(f"time limits must be > 0: {values}")
        return {**DEFAULT_TIME_LIMITS, **values}

    def pool_concurrency(self, pool: Pool) -> int:
        """Worker processes of a pool; the comparison setup's `shared` pool has A + B + C."""
        if pool == "shared":
            return sum(self.concurrency[t.value] for t in TIERS)
        return self.concurrency[pool]

    @property
    def max_deliveries(self) -> int:
        """How often one message may begin its run: `task_max_deliveries`, by default
        `task_max_retries + 1`, the runs a task may lose its pool process in (`retry_on_worker_lost`),
        so losing the whole worker costs a task no more runs than losing its pool process."""
        if self.task_max_deliveries is not None:
            return self.task_max_deliveries
        return self.task_max_retries + 1

    def pool_prefetch(self, pool: Pool) -> int:
        return 1 if pool == "shared" else self.prefetch[pool]

    def time_limits(self, tier: Tier) -> tuple[float, float]:
        """(soft, hard) seconds for a task of `tier`."""
        soft = self.time_limit_s[Tier(tier)]
        return soft, soft + self.time_limit_grace_s
