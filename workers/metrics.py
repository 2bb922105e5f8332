"""Prometheus metrics of the tier workers, per tier: task duration, queue wait, retries, failures,
LLM tokens and estimated cost.

A pool is one Celery main process with prefork children, and the children run the tasks, so the
metrics use prometheus-client's multiprocess mode: every process writes its samples to files in
the pool's directory (`PROMETHEUS_MULTIPROC_DIR`), and the main process serves the sum of all of
them on its `/metrics` port. `start_pool_exporter` sets that up from the `celeryd_init` signal,
before any pool child exists and before anything imports prometheus_client (which reads the
variable once, at import). Without a metrics port nothing is written to disk: the metrics stay in
this process's registry (an in-process worker, tests).

Ports: `ARAG_WORKER_METRICS_PORT` + the pool's offset (A 0, B 1, C 2, shadow 3, shared 4), so
the pools of one machine never collide and a pool listens on the same port wherever it runs.
"""

from __future__ import annotations

import os
import shutil
import sys
from functools import cache
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from adaptive_rag.contracts import AnswerResult

MULTIPROC_ENV = "PROMETHEUS_MULTIPROC_DIR"
POOL_OFFSETS = {"tier-a": 0, "tier-b": 1, "tier-c": 2, "shadow": 3, "shared": 4}
# Seconds; tier A takes well under a second, C up to its 300 s limit.
DURATION_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 20, 30, 60, 120, 300)
QUEUE_WAIT_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300)
TOKEN_BUCKETS = (16, 64, 256, 512, 1024, 2048, 4096, 8192, 16384)


def pool_of(hostname: str) -> str:
    """The pool's queue from a worker hostname (`tier-c@host` -> `tier-c`)."""
    return hostname.split("@", 1)[0]


def pool_port(base: int, hostname: str) -> int | None:
    """The metrics port of the pool named by `hostname`; None for an unknown pool or base 0."""
    offset = POOL_OFFSETS.get(pool_of(hostname))
    return None if not base or offset is None else base + offset


class WorkerMetrics:
    """The metrics; one instance per process (`worker_metrics()`), created on first use."""

    def __init__(self, registry: Any = None) -> None:
        from prometheus_client import CollectorRegistry, Counter, Histogram

        self.registry = registry if registry is not None else CollectorRegistry()
        r = self.registry
        self.duration = Histogram(
            "arag_worker_task_seconds", "Time a worker spent on one task (strategy + records), by tier, "
            "kind and outcome (ok, abstained, or the error code)", ["tier", "kind", "outcome"],
            buckets=DURATION_BUCKETS, registry=r)
        self.queue_wait = Histogram(
            "arag_worker_queue_wait_seconds", "From enqueue at the front door to the task's start",
            ["tier", "kind"], buckets=QUEUE_WAIT_BUCKETS, registry=r)
        self.retries = Counter(
            "arag_worker_task_retries_total", "Task runs sent back to the queue (transient failure, "
            "or the records database away)", ["tier", "kind", "reason"], registry=r)
        self.failures = Counter(
            "arag_worker_task_failures_total", "Error results recorded, by error code",
            ["tier", "kind", "code"], registry=r)
        self.prompt_tokens = Counter(
            "arag_worker_prompt_tokens_total", "LLM prompt tokens spent", ["tier", "kind"], registry=r)
        self.completion_tokens = Counter(
            "arag_worker_completion_tokens_total", "LLM completion tokens spent", ["tier", "kind"],
            registry=r)
        self.tokens_per_request = Histogram(
            "arag_worker_request_tokens", "Prompt + completion tokens of one request", ["tier", "kind"],
            buckets=TOKEN_BUCKETS, registry=r)
        self.cost = Counter(
            "arag_worker_llm_cost_total", "Estimated LLM cost (tokens x ARAG_PRICE_PER_1K_*_TOKENS / 1000)",
            ["tier", "kind"], registry=r)

    def task_done(self, result: AnswerResult, seconds: float) -> None:
        """One finished run: its duration, queue wait, tokens, cost, and the failure if any."""
        tier, kind = result.tier.value, result.kind.value
        if result.error_code is not None:
            outcome = result.error_code.value
            self.failures.labels(tier, kind, outcome).inc()
        else:
            outcome = "ok" if result.answerable else "abstained"
        self.duration.labels(tier, kind, outcome).observe(seconds)
        self.queue_wait.labels(tier, kind).observe(result.timings.queue_wait_ms / 1000)
        if result.prompt_tokens or result.completion_tokens:
            self.prompt_tokens.labels(tier, kind).inc(result.prompt_tokens)
            self.completion_tokens.labels(tier, kind).inc(result.completion_tokens)
            self.tokens_per_request.labels(tier, kind).observe(result.prompt_tokens + result.completion_tokens)
        if result.cost:
            self.cost.labels(tier, kind).inc(result.cost)

    def task_retried(self, tier: str, kind: str, reason: str) -> None:
        self.retries.labels(tier, kind, reason).inc()

    def task_failed(self, tier: str, kind: str, code: str) -> None:
        """A failure recorded outside the task body (hard time limit, pool process lost)."""
        self.failures.labels(tier, kind, code).inc()


@cache
def worker_metrics() -> WorkerMetrics:
    """This process's metrics (in multiprocess mode their samples go to the pool's files)."""
    return WorkerMetrics()


def start_pool_exporter(hostname: str, base_port: int, metrics_dir: Path,
                        address: str = "127.0.0.1") -> int | None:
    """In a pool's main process, before it forks: a fresh multiprocess directory for the pool,
    and `/metrics` over every process's samples on the pool's port. Returns the port (None: no
    port configured, nothing started)."""
    port = pool_port(base_port, hostname)
    if port is None:
        return None
    if MULTIPROC_ENV not in os.environ:
        folder = metrics_dir.resolve() / f"{pool_of(hostname)}-{os.getpid()}"
        shutil.rmtree(folder, ignore_errors=True)
        folder.mkdir(parents=True)
        os.environ[MULTIPROC_ENV] = str(folder)  # inherited by the pool's children
        _remove_dead_pools(metrics_dir.resolve(), pool_of(hostname))
    if "prometheus_client.values" in sys.modules:  # imported before the directory was known
        from prometheus_client import values

        values.ValueClass = values.get_value_class()
    from prometheus_client import CollectorRegistry, start_http_server
    from prometheus_client.multiprocess import MultiProcessCollector

    registry = CollectorRegistry()
    MultiProcessCollector(registry)
    start_http_server(port, addr=address, registry=registry)
    return port


def process_exited(pid: int) -> None:
    """A pool child ended: drop its live-gauge files (counters and histograms stay summed)."""
    if MULTIPROC_ENV in os.environ:
        from prometheus_client import multiprocess

        multiprocess.mark_process_dead(pid)


def _remove_dead_pools(root: Path, pool: str) -> None:
    """Directories of earlier runs of this pool whose main process is gone (killed, not stopped)."""
    for folder in root.glob(f"{pool}-*"):
        pid = folder.name.rsplit("-", 1)[-1]
        if pid.isdigit() and int(pid) != os.getpid() and not Path(f"/proc/{pid}").exists():
            shutil.rmtree(folder, ignore_errors=True)
