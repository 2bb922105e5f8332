"""`python -m services.frontdoor`: the gRPC front door on `ARAG_GRPC_LISTEN`, Prometheus metrics
on `ARAG_METRICS_PORT`, traces as `ARAG_TRACES` says (`workers.telemetry`), JSON logs on stderr;
stops cleanly on SIGTERM / SIGINT."""

from __future__ import annotations

import argparse
import asyncio
import functools
import signal
import sys
from collections.abc import Callable

import structlog

from adaptive_rag.logs import configure_logging
from adaptive_rag.settings import ClassifierSettings, Settings

from services.frontdoor.settings import FrontDoorSettings


async def serve(listen: str | None = None, settings: FrontDoorSettings | None = None) -> None:
    """Build the real adapters from the settings (read once), serve until a signal."""
    from adaptive_rag.knowledge.service import open_knowledge_service
    from adaptive_rag.storage import RecordStore, make_engine
    from workers.client import CeleryTaskQueue, open_result_waiter, stored_results

    from services.frontdoor.fair_share import open_fair_share

    from services.frontdoor.metrics import FrontDoorMetrics, start_exporter
    from adaptive_rag.routing.hot_swap import ClassifierRouter, build_triton_classifier
    from services.frontdoor.routing import open_router
    from services.frontdoor.server import start_server
    from workers.telemetry import TracingSettings, configure_tracing, flush_tracing

    log = structlog.get_logger("frontdoor")
    log.info("event_loop", loop=f"{type(asyncio.get_running_loop()).__module__}")
    tracing = TracingSettings()
    if configure_tracing("frontdoor", tracing) is not None:
        log.info("tracing", exporter=tracing.mode)
    library, settings = Settings(), settings or FrontDoorSettings()
    metrics = FrontDoorMetrics()
    router = open_router(settings.router, settings.router_dir, library, lambda: ClassifierRouter(
        ClassifierSettings(), settings.model_poll_s,
        build=functools.partial(build_triton_classifier, cache_size=settings.routing_cache),
        on_version=lambda model, version: metrics.model_version.labels(model).set(version),
    ))
    router.refresh()
    log.info("router", kind=settings.router, model=router.model_name)
    if settings.metrics_port:
        host = (listen or settings.grpc_listen).rpartition(":")[0].strip("[]") or "127.0.0.1"
        start_exporter(metrics, settings.metrics_port, host)
        log.info("metrics_exporter", address=f"{host}:{settings.metrics_port}")
    engine = make_engine(library.database_url)
    records, queue = RecordStore(engine), CeleryTaskQueue()
    # Health pings the workers on its cycle. Celery's ping is a broadcast on the broker; the
    # server-less filesystem broker of the embedded setup supports it too (its control folder).
    worker_probe = (
        functools.partial(queue.workers_alive, settings.worker_ping_timeout_s)
        if settings.health_workers else None
    )
    # With an LLM endpoint configured (the workers' shared server), readiness waits for it too.
    llm_probe = None
    if settings.health_workers and library.llm_base_url:
        from adaptive_rag.llm.openai_compat import OpenAICompatibleLLM

        llm_probe = OpenAICompatibleLLM(library.llm_base_url, library.llm_model,
                                        api_key=library.llm_api_key, max_retries=0).readiness_problem
    running = await start_server(
        library, settings, records, queue,
        # while Redis restarts, results are read from the records (the worker writes them first)
        open_result_waiter(threads=settings.wait_threads, stored=stored_results(records)), router,
        open_knowledge_service(library, engine), metrics, listen=listen,
        fair_share=open_fair_share(settings), worker_probe=worker_probe, llm_probe=llm_probe,
    )
    print(f"READY front door on port {running.port}", flush=True)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()
    log.info("stopping")
    await running.stop(grace=5.0)
    flush_tracing()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--listen", default=None, help="host:port (default: ARAG_GRPC_LISTEN)")
    parser.add_argument("--log-level", default="INFO")
    args = parser.parse_args(argv)
    configure_logging(args.log_level)
    settings = FrontDoorSettings()
    if (problem := startup_problem(Settings().database_url, settings.redis_url)) is not None:
        print(f"front door not started: {problem}", file=sys.stderr, flush=True)
        return 2
    with asyncio.Runner(loop_factory=event_loop_factory(settings.event_loop)) as runner:
        runner.run(serve(args.listen, settings))
    return 0


def startup_problem(database_url: str, redis_url: str | None) -> str | None:
    """What makes this configuration unable to serve (a Sentinel list that names no working
    primary, a records URL with no writable host), or None (see `workers.startup`)."""
    from adaptive_rag.errors import ConfigurationError
    from workers.startup import check_backing_services

    try:
        found = check_backing_services(database_url, redis_url)
    except ConfigurationError as exc:
        return str(exc)
    structlog.get_logger("frontdoor").info("startup_checks", **found)
    return None


def event_loop_factory(name: str) -> Callable[[], asyncio.AbstractEventLoop] | None:
    """uvloop's loop (libuv; grpc.aio runs on any asyncio loop) or None: the standard one."""
    if name == "uvloop":
        import uvloop

        return uvloop.new_event_loop
    return None


if __name__ == "__main__":
    sys.exit(main())
