"""The one Celery app: tier queues, delivery guarantees and time limits, all from `WorkerSettings`.

Broker and result backend are Redis when `REDIS_URL` is set, so a waiting front door gets its
result through Redis pub/sub (no database polling). Without it, everything runs with no server:
a kombu filesystem transport and a file result backend under `ARAG_BROKER_DIR` (`var/broker`).

Delivery: `acks_late` + `reject_on_worker_lost` means a message is acknowledged only after its
task finished; a worker process that dies mid-task gets its message requeued (prefork child lost)
or redelivered after the broker's visibility timeout (whole worker lost). The task itself makes
the second run harmless (one result row per request, see `workers.tasks`).

Worker CLI: `celery -A workers.celery_app worker -Q tier-c ...` (see `workers.pools`). Producers
(the front door) use `workers.client`, which never imports the task module.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from celery import Celery, signals
from kombu import Queue

from adaptive_rag.contracts import QUEUE_FOR_TIER, SHADOW_QUEUE, SHARED_QUEUE, TIERS
from adaptive_rag.logs import configure_logging
from workers.settings import WorkerSettings

QUEUES = (*QUEUE_FOR_TIER.values(), SHADOW_QUEUE)
# How often the server-less broker looks for new messages, and waiters for file results.
FILESYSTEM_POLL_S = 0.1
logger = logging.getLogger(__name__)


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
        "result_expires": 24 * 3600,
        "broker_connection_retry_on_startup": True,
        "worker_hijack_root_logger": False,
        "worker_redirect_stdouts": False,
        "worker_send_task_events": False,
        "task_send_sent_event": False,
    }
    if settings.redis_url:
        visibility = settings.visibility_timeout_s
        longest = max(settings.time_limits(tier)[1] for tier in TIERS)
        if visibility <= longest:
            logger.warning(
                "visibility timeout %.0f s is not above the longest hard time limit %.0f s: a task "
                "still running then is delivered a second time (its result is still written once)",
                visibility, longest,
            )
        config.update(
            broker_url=settings.redis_url,
            result_backend=settings.redis_url,
            broker_transport_options={
                "visibility_timeout": visibility,
                # Sweep for messages of dead workers often enough to notice them about one
                # visibility timeout after the loss (kombu's default sweep is ~100 s).
                "unacked_restore_interval": max(1, min(10, int(visibility // 5))),
                "unacked_restore_throttle": 1,
            },
            result_backend_transport_options={"visibility_timeout": visibility},
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


@signals.celeryd_init.connect
def _json_logs(**_: Any) -> None:
    """A worker's own events are JSON lines, like the front door's (its pool children inherit)."""
    configure_logging(stdlib=False)


# The app of this process: workers (`celery -A workers.celery_app`) and the front door.
app = create_app()
