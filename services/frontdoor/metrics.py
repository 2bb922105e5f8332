"""Prometheus metrics of the front door, in their own registry (one per server, so tests and
several servers in one process do not collide), exported over HTTP by `start_exporter`."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, start_http_server

from adaptive_rag.contracts import RoutingDecision, Tier

STAGE_METRIC = "arag_frontdoor_stage_seconds"

# Seconds; tier A answers in well under a second, C can take a minute.
LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120)
# Seconds; most stages take a millisecond or a few, waiting for a result can take a minute.
STAGE_BUCKETS = (0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.25, 0.5, 1, 5, 30, 120)


class FrontDoorMetrics:
    """Requests and latency per method/tier/status, queue depth per queue, fallbacks, model version."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry()
        self.requests = Counter(
            "arag_frontdoor_requests_total", "RPCs answered, by method, tier and gRPC status",
            ["method", "tier", "code"], registry=self.registry,
        )
        self.latency = Histogram(
            "arag_frontdoor_request_seconds", "RPC latency at the front door, by method, tier and status",
            ["method", "tier", "code"], buckets=LATENCY_BUCKETS, registry=self.registry,
        )
        self.queue_depth = Gauge(
            "arag_queue_depth", "Tasks waiting in a Celery queue (last observed)", ["queue"],
            registry=self.registry,
        )
        self.routed = Counter(
            "arag_routing_decisions_total", "Routing decisions by tier and whether the rules decided",
            ["tier", "fallback"], registry=self.registry,
        )
        self.fallbacks = Counter(
            "arag_classifier_fallback_total", "Decisions made by the rules because Triton was unavailable",
            registry=self.registry,
        )
        self.model_version = Gauge(
            "arag_classifier_model_version", "Classifier model version the front door routes with",
            ["model"], registry=self.registry,
        )
        self.stages = Histogram(
            STAGE_METRIC, "Time per stage of a front-door call (authenticate, "
            "validate, idempotency, classify, record, admit, enqueue, wait, reply)",
            ["method", "stage"], buckets=STAGE_BUCKETS, registry=self.registry,
        )
        self.rejected = Counter(
            "arag_frontdoor_rejected_total", "Queries rejected because the tier's queue was full",
            ["tier"], registry=self.registry,
        )
        self.expired = Counter(
            "arag_requests_expired_total", "Requests left queued past the expiry age (never started) "
            "that the sweep moved to expired", registry=self.registry,
        )
        self.republished = Counter(
            "arag_requests_republished_total", "Queued requests published again: their task was "
            "never marked published (a front door died between record and enqueue), or the broker "
            "lost it on the way to a worker",
            registry=self.registry,
        )
        self.workers_alive = Gauge(
            "arag_workers_alive", "Workers that answered the health check's last ping, per queue",
            ["queue"], registry=self.registry,
        )

    def observe(self, method: str, tier: str, code: str, seconds: float) -> None:
        self.requests.labels(method, tier, code).inc()
        self.latency.labels(method, tier, code).observe(seconds)

    def observe_stages(self, method: str, stages: dict[str, float]) -> None:
        """`stages`: milliseconds per stage of one call."""
        for stage, ms in stages.items():
            self.stages.labels(method, stage).observe(ms / 1000)

    def routed_decision(self, decision: RoutingDecision) -> None:
        self.routed.labels(decision.tier.value, str(decision.fallback).lower()).inc()
        if decision.fallback:
            self.fallbacks.inc()

    def rejected_query(self, tier: Tier) -> None:
        self.rejected.labels(tier.value).inc()

    def expired_requests(self, count: int) -> None:
        self.expired.inc(count)

    def republished_requests(self, count: int) -> None:
        self.republished.inc(count)

    def queue_depth_seen(self, queue: str, depth: int) -> None:
        self.queue_depth.labels(queue).set(depth)


def start_exporter(metrics: FrontDoorMetrics, port: int, address: str = "127.0.0.1"):
    """Serve `/metrics` on `address:port` in a daemon thread; returns (server, thread)."""
    return start_http_server(port, addr=address, registry=metrics.registry)


def stage_totals(exposition: str, method: str = "Answer") -> dict[str, tuple[float, float]]:
    """stage -> (seconds summed, calls) of `method` from a /metrics page (benchmarks read it)."""
    from prometheus_client.parser import text_string_to_metric_families

    totals: dict[str, list[float]] = {}
    for family in text_string_to_metric_families(exposition):
        if family.name != STAGE_METRIC:
            continue
        for sample in family.samples:
            if sample.labels.get("method") != method:
                continue
            slot = totals.setdefault(sample.labels.get("stage", "?"), [0.0, 0.0])
            if sample.name.endswith("_sum"):
                slot[0] = sample.value
            elif sample.name.endswith("_count"):
                slot[1] = sample.value
    return {stage: (total, calls) for stage, (total, calls) in totals.items()}
