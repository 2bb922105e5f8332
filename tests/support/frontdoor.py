"""The front door in the test process, for tests whose subject is the path after routing
(workers, broker, records): `in_process_front_door`, with stand-ins for its router and
knowledge-base check (every query goes to one tier, every tenant has a knowledge base)."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import grpc

from adaptive_rag.contracts import RoutingDecision, Tier


class FixedRouter:
    """Every query to `tier` (the router is not what these tests are about)."""

    version = 0
    model_name = "test"

    def __init__(self, tier: Tier = Tier.A) -> None:
        self.tier = tier

    async def route(self, query: str, tenant: str | None = None) -> RoutingDecision:
        return RoutingDecision(tier=self.tier, fallback=True, reason="test")

    async def poll_forever(self) -> None:
        return None

    def close(self) -> None:
        return None


class EveryTenantHasKnowledge:
    def has_knowledge_base(self, tenant: str) -> bool:
        return True


@dataclass
class FrontDoorClient:
    """A client of an in-process front door: its channel and stub, a key of tenant acme, and
    the server's metrics registry."""

    channel: grpc.Channel
    stub: Any
    auth: tuple[tuple[str, str], ...]
    metrics: Any
    pb2: Any


@contextmanager
def in_process_front_door(store: Any, library: Any, queue: Any, app: Any, *, health_watch_s: float | None = None,
                          worker_probe: Any = None, **settings: Any) -> Iterator[FrontDoorClient]:
    """The real front door server on its own event loop thread in this process, over `queue` (the
    real task queue, or a wrapper that loses messages) and `app`'s results, routed by
    `FixedRouter`; `settings` are FrontDoorSettings values. Stopped on exit."""
    from services.frontdoor.metrics import FrontDoorMetrics
    from services.frontdoor.server import start_server
    from services.frontdoor.settings import FrontDoorSettings
    from services.frontdoor.stubs import pb2, pb2_grpc
    from workers.client import open_result_waiter, stored_results

    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    metrics = FrontDoorMetrics()
    running = asyncio.run_coroutine_threadsafe(start_server(
        library, FrontDoorSettings(_env_file=None, **{"metrics_port": 0, "deadline_margin_s": 0.5, **settings}),
        store, queue, open_result_waiter(app, stored=stored_results(store)), FixedRouter(),
        EveryTenantHasKnowledge(), metrics, listen="127.0.0.1:0", poll_models=False,
        queue_watch_s=None, health_watch_s=health_watch_s, worker_probe=worker_probe,
    ), loop).result(30)
    channel = grpc.insecure_channel(f"127.0.0.1:{running.port}")
    key = store.create_api_key("acme")
    try:
        yield FrontDoorClient(channel, pb2_grpc.AdaptiveRagStub(channel), (("authorization", f"Bearer {key}"),),
                              metrics, pb2)
    finally:
        channel.close()
        asyncio.run_coroutine_threadsafe(running.stop(0), loop).result(30)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(10)
