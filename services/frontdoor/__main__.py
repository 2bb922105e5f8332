"""`python -m services.frontdoor`: the gRPC front door on `ARAG_GRPC_LISTEN`, Prometheus metrics
on `ARAG_METRICS_PORT`, JSON logs on stderr; stops cleanly on SIGTERM / SIGINT."""

from __future__ import annotations

import argparse
import asyncio
import signal
import sys

from adaptive_rag.settings import Settings

from services.frontdoor.logs import configure_logging, get_logger


def build_dependencies(settings: Settings):
    """The real store (database), dispatcher (Celery), classifier router and metrics."""
    from adaptive_rag.storage.db import make_engine
    from adaptive_rag.storage.records import RecordStore

    from services.frontdoor.dispatcher import CeleryDispatcher
    from services.frontdoor.metrics import FrontDoorMetrics
    from services.frontdoor.routing import ClassifierRouter

    metrics = FrontDoorMetrics()
    router = ClassifierRouter(
        settings, on_version=lambda model, version: metrics.model_version.labels(model).set(version)
    )
    router.refresh()
    store = RecordStore(make_engine(settings.database_url))
    return store, CeleryDispatcher(), router, metrics


async def serve(settings: Settings, listen: str | None = None) -> None:
    from services.frontdoor.metrics import start_exporter
    from services.frontdoor.server import start_server

    log = get_logger("frontdoor")
    store, dispatcher, router, metrics = build_dependencies(settings)
    if settings.metrics_port:
        host = (listen or settings.grpc_listen).rpartition(":")[0].strip("[]") or "127.0.0.1"
        start_exporter(metrics, settings.metrics_port, host)
        log.info("metrics_exporter", address=f"{host}:{settings.metrics_port}")
    running = await start_server(settings, store, dispatcher, router, metrics, listen=listen)
    print(f"READY front door on port {running.port}", flush=True)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()
    log.info("stopping")
    await running.stop(grace=5.0)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--listen", default=None, help="host:port (default: ARAG_GRPC_LISTEN)")
    parser.add_argument("--log-level", default="INFO")
    args = parser.parse_args(argv)
    configure_logging(args.log_level)
    asyncio.run(serve(Settings(), args.listen))
    return 0


if __name__ == "__main__":
    sys.exit(main())
