"""The one Celery app: tier queues, delivery guarantees and time limits, all from `WorkerSettings`.

Broker and result backend are Redis when `REDIS_URL` is set, so a waiting front door gets its
result through Redis pub/sub (no database polling). Without it, everything runs with no server:
a kombu filesystem transport and a file result backend under `ARAG_BROKER_DIR` (`var/broker`).

Delivery: `acks_late` + `reject_on_worker_lost` means a message is acknowledged only after its
task finished; a worker process that dies mid-task gets its message requeued (prefork child lost)
or redelivered after the broker's visibility timeout (whole worker lost). The task itself makes
the second run harmless (one result row per request, see `workers.tasks`) and stops running a
message that keeps killing its worker (`WorkerSettings.max_deliveries`, counted in the records).

Worker CLI: `celery -A workers.celery_app worker -Q tier-c ...` (see `workers.pools`). Producers
(the front door) use `workers.client`, which never imports the task module.
"""

from __future__ import annotations

import logging
import warnings
from pathlib import Path
from typing import Any

from celery import Celery, signals
from celery.exceptions import CPendingDeprecationWarning
from kombu import Queue

from adaptive_rag.contracts import QUEUE_FOR_TIER, SHADOW_QUEUE, SHARED_QUEUE, TIERS
from adaptive_rag.logs import configure_logging
from workers import redis_connections, redis_results
from workers.settings import WorkerSettings

QUEUES = (*QUEUE_FOR_TIER.values(), SHADOW_QUEUE)
# How often the server-less broker looks for new messages, and waiters for file results.
FILESYSTEM_POLL_S = 0.1
logger = logging.getLogger(__name__)
# Redis connections (broker and result backend, workers and producers): a pooled connection idle
# longer than `health_check_interval` is pinged before use, so one left dead by a Redis restart
# is replaced instead of failing the next command; connecting gives up after a few seconds.
REDIS_CONNECTION_OPTIONS: dict[str, Any] = {
    "health_check_interval": 10,
    "socket_connect_timeout": 5,
    "socket_keepalive": True,
    "retry_on_timeout": True,
}
# Exponential backoff from 10 ms, capped at 10 s per wait: 12 tries span about 30 s.
RESULT_WRITE_RETRIES = 12
# Celery warns on every reconnect while `worker_cancel_long_running_tasks_on_connection_loss` is
# False; it is False on purpose here (see `celery_config`).
warnings.filterwarnings("ignore", message=r"\s*In Celery 5\.1 we introduced an optional breaking change",
                        category=CPendingDeprecationWarning)


def broker_folders(settings: WorkerSettings) -> dict[str, Path]:
    """Where the server-less broker keeps messages and results (absolute, shared by processes)."""
    root = settings.broker_dir.resolve()
    return {name: root / name for name in ("queue", "processed", "results", "control")}


def celery_config(settings: WorkerSettings) -> dict[str, Any]:
    """Celery settings for `settings` (a plain dict: easy to inspect in tests)."""
    config: dict[str, Any] = {
        "task_queues": [Queue(name, routing_key=name) for name in QUEUES]
        + ([Queue(SHARED_QUEUE, routing_key=SHARED_QUEUE)] if settings.shared_queue else []),
        "task_default_queue": QUEUE_FOR_TIER[TIERS[1]],
        "task_create_missing_queues": False,
        # Acknowledge after the task ran; a lost worker's message goes back to the queue.
        "task_acks_late": True,
        "task_reject_on_worker_lost": True,
        # One message reserved per process unless a pool says otherwise (`--prefetch-multiplier`).
        "worker_prefetch_multiplier": 1,
        # Loading the LLM in a fresh pool process takes seconds on a busy machine.
        "worker_proc_alive_timeout": 120.0,
        "task_serializer": "json",
        "result_serializer": "json",
        "accept_content": ["json"],
        # Results live in Redis only for the front doors' waits (the records database keeps
        # every answer: GetResult and replays read it there); kept longer, Redis grows with the
        # traffic (reports/soak/: +130 %/h at 58 Answers/s with a day's worth).
        "result_expires": int(settings.result_ttl_s),
        # A broker that is away (restarted, failed over) is waited for, never given up on: the
        # pools keep running and reconnect, the health check reports the outage meanwhile.
        "broker_connection_retry": True,
        "broker_connection_retry_on_startup": True,
        "broker_connection_max_retries": None,
        # A task already running when the broker goes away finishes and writes its result (once);
        # cancelling it would only run it again from the start after the reconnect.
        "worker_cancel_long_running_tasks_on_connection_loss": False,
        # A send that meets a dropped connection reconnects and tries again for about 1.5 s
        # (a broker failover); longer, and the front door answers UNAVAILABLE with a retry hint.
        "task_publish_retry": True,
        "task_publish_retry_policy": {"max_retries": 3, "interval_start": 0,
                                      "interval_step": 0.5, "interval_max": 1.0},
        "worker_hijack_root_logger": False,
        "worker_redirect_stdouts": False,
        "worker_send_task_events": False,
        "task_send_sent_event": False,
    }
    if settings.redis_url:
        address = redis_connections.parse(settings.redis_url)
        visibility = settings.visibility_timeout_s
        longest = max(settings.time_limits(tier)[1] for tier in TIERS)
        if visibility <= longest:
            logger.warning(
                "visibility timeout %.0f s is not above the longest hard time limit %.0f s: a task "
                "still running then is delivered a second time (its result is still written once)",
                visibility, longest,
            )
        config.update(
            broker_url=address.celery_url(),
            # kombu's Redis transport (Sentinel: its Sentinel transport), safe across a broker
            # restart (see the module)
            broker_transport=redis_broker_transport(address),
            # Celery's Redis result backend, without its read before each success (see the module)
            result_backend=redis_results.backend_url(address),
            broker_transport_options={
                # Sentinel: the primary's group name, the Sentinels' own timeouts
                **address.transport_options(),
                "visibility_timeout": visibility,
                "consumer_lease_s": settings.consumer_lease_s,
                # Sweep for messages of dead workers often enough to notice them about one
                # visibility timeout, or one consumer lease, after the loss (kombu's default
                # sweep is ~100 s).
                "unacked_restore_interval": max(1, int(min(settings.consumer_lease_s / 2, visibility / 5))),
                "unacked_restore_throttle": 1,
                **REDIS_CONNECTION_OPTIONS,
            },
            result_backend_transport_options={"visibility_timeout": visibility, **address.transport_options()},
            # A result written while Redis restarts is retried (about 30 s of backoff) instead
            # of being lost; the records database holds it in any case.
            result_backend_always_retry=True,
            result_backend_max_retries=RESULT_WRITE_RETRIES,
            redis_socket_connect_timeout=REDIS_CONNECTION_OPTIONS["socket_connect_timeout"],
            redis_socket_keepalive=True,
            redis_retry_on_timeout=True,
            redis_backend_health_check_interval=REDIS_CONNECTION_OPTIONS["health_check_interval"],
        )
    else:
        folders = broker_folders(settings)
        for folder in folders.values():
            folder.mkdir(parents=True, exist_ok=True)
        config.update(
            broker_url="filesystem://",
            # kombu's filesystem transport, writing each message atomically (see the module)
            broker_transport="workers.filesystem_broker:Transport",
            broker_transport_options={
                "control_folder": str(folders["control"]),
                "data_folder_in": str(folders["queue"]),
                "data_folder_out": str(folders["queue"]),
                "processed_folder": str(folders["processed"]),
                "store_processed": False,
                # kombu polls the folder once a second by default: a one-second floor on every
                # answer of the embedded setup. A listing every 0.1 s costs little.
                "polling_interval": FILESYSTEM_POLL_S,
            },
            result_backend=f"file://{folders['results']}",
        )
    return config


def redis_broker_transport(address: redis_connections.RedisAddress) -> str:
    """The kombu transport for a Redis broker: one server, or a primary found by Sentinel."""
    return "workers.redis_broker:SentinelTransport" if address.is_sentinel else "workers.redis_broker:Transport"


def create_app(settings: WorkerSettings | None = None, results: bool = True) -> Celery:
    """A Celery app configured from `settings` (default: the environment).

    The settings stay reachable as `app_settings(app)` so the producer side uses the same time
    limits and broker the app was built with. `results=False` makes a sending-only app: without a
    result backend, sending a task subscribes to nothing (with Redis, Celery would otherwise
    SUBSCRIBE to every sent task's result channel; the front door waits through its own waiter).
    """
    settings = settings or WorkerSettings()
    app = Celery("adaptive_rag", include=["workers.tasks"])
    app.conf.update(celery_config(settings))
    if not results:
        app.conf.result_backend = None
    app.arag_settings = settings  # type: ignore[attr-defined]
    return app


def app_settings(app: Celery) -> WorkerSettings:
    return getattr(app, "arag_settings", None) or WorkerSettings()


# Celery's own line per task received and per task succeeded (the latter with a repr of the whole
# result): the task logs its own `task.started` / `task.done` lines with the request id, so these
# only repeat them, at a cost per task the pools pay at every rate. Warnings and errors still show.
PER_TASK_LOGGERS = ("celery.worker.strategy", "celery.app.trace")


@signals.celeryd_init.connect
def _json_logs(**_: Any) -> None:
    """A worker's own events are JSON lines, like the front door's (its pool children inherit)."""
    configure_logging(stdlib=False)
    for name in PER_TASK_LOGGERS:
        logging.getLogger(name).setLevel(logging.WARNING)


@signals.celeryd_init.connect
def _metrics_exporter(sender: str | None = None, **_: Any) -> None:
    """The pool's `/metrics` (all its processes summed), started before the pool forks."""
    settings = WorkerSettings()
    if settings.worker_metrics_port and sender:
        from workers.metrics import start_pool_exporter

        port = start_pool_exporter(sender, settings.worker_metrics_port, settings.worker_metrics_dir,
                                   settings.worker_metrics_addr)
        logger.info("worker metrics on port %s", port)


@signals.worker_process_init.connect
def _tracing(sender: str | None = None, **_: Any) -> None:
    """Each pool process exports its spans (`ARAG_TRACES`) and continues the trace each task's
    headers carry (`traceparent`, written by `workers.client`). Set up after the fork: the
    exporter's thread must belong to the process that runs the tasks."""
    from workers.metrics import pool_of
    from workers.telemetry import configure_tracing

    queue = pool_of(sender or "worker")
    if configure_tracing(f"worker-{queue}", **{"arag.queue": queue}) is not None:
        from opentelemetry.instrumentation.celery import CeleryInstrumentor

        CeleryInstrumentor().instrument()


@signals.worker_process_shutdown.connect
def _flush_telemetry(pid: int | None = None, **_: Any) -> None:
    """A pool process ends without atexit hooks: write its buffered spans, drop its gauges."""
    from workers.metrics import process_exited
    from workers.telemetry import flush_tracing

    flush_tracing()
    if pid:
        process_exited(pid)


# The app of this process: workers (`celery -A workers.celery_app`) and the front door.
app = create_app()
