"""The front door's classifier holder: picks up a newly published model version without a
restart, only once Triton serves it, and records which version decided."""

from __future__ import annotations

import asyncio

import pytest

from adaptive_rag.contracts import RoutingDecision, Tier
from adaptive_rag.routing.policy import fallback_decision
from adaptive_rag.settings import ClassifierSettings
from adaptive_rag.routing import hot_swap
from adaptive_rag.routing.hot_swap import ClassifierRouter


class FakeClient:
    """Stands in for a pinned `TritonClassifier`; `ready` says whether Triton serves its version."""

    def __init__(self, version: int, ready: bool, down: bool = False) -> None:
        self.version, self.ready, self.down, self.closed = version, ready, down, False

    def is_ready(self) -> bool:
        return self.ready

    async def aclassify(self, query: str) -> RoutingDecision:
        if self.down:
            return fallback_decision(query, "Triton unreachable")
        return RoutingDecision(tier=Tier.B, probabilities={"A": 0.2, "B": 0.7, "C": 0.1},
                               model_name="complexity", model_version=self.version, reason="argmax B")

    def close(self) -> None:
        self.closed = True


def publish(repo, version: int) -> None:
    path = repo / "complexity" / str(version)
    path.mkdir(parents=True)
    (path / "model.onnx").write_bytes(b"onnx")


@pytest.fixture
def setup(tmp_path, monkeypatch):
    monkeypatch.setattr(hot_swap, "CLOSE_GRACE_S", 0.0)
    settings = ClassifierSettings(_env_file=None, model_repository=tmp_path)
    ready = {1: True, 2: False}
    built: list[FakeClient] = []
    seen: list[tuple[str, int]] = []

    def build(_settings, version):
        built.append(FakeClient(version, ready.get(version, True)))
        return built[-1]

    router = ClassifierRouter(settings, 0.05, build=build, on_version=lambda m, v: seen.append((m, v)))
    return router, ready, built, seen, tmp_path


def test_no_published_model_routes_with_the_rules(setup):
    router, *_ = setup
    assert router.refresh() is False
    routed = asyncio.run(router.route("What is the difference between a lamp and a bulb?"))
    assert routed.fallback and routed.model_name == "rules" and routed.model_version is None


def test_a_new_version_is_used_once_triton_serves_it(setup):
    router, ready, built, seen, repo = setup
    publish(repo, 1)
    assert router.refresh() and router.version == 1
    routed = asyncio.run(router.route("Who makes Lumora lamps?"))
    assert (routed.model_name, routed.model_version, routed.fallback) == ("complexity", 1, False)
    publish(repo, 2)
    assert router.refresh() is False and router.version == 1  # published, not loaded yet
    assert built[-1].closed
    ready[2] = True
    assert router.refresh() is True and router.version == 2
    assert asyncio.run(router.route("Who makes Lumora lamps?")).model_version == 2
    assert seen == [("complexity", 1), ("complexity", 2)]
    import time

    time.sleep(0.1)  # the replaced client is closed after the grace period
    assert built[0].closed and not built[-1].closed


def test_polling_swaps_without_a_restart(setup):
    router, ready, _built, _seen, repo = setup
    publish(repo, 1)
    router.refresh()
    ready[2] = True

    async def scenario() -> int:
        poller = asyncio.create_task(router.poll_forever())
        publish(repo, 2)
        for _ in range(100):
            await asyncio.sleep(0.02)
            if router.version == 2:
                break
        poller.cancel()
        return (await router.route("q")).model_version

    assert asyncio.run(scenario()) == 2


def test_triton_down_gives_the_flagged_fallback_without_a_version(setup):
    router, _ready, built, _seen, repo = setup
    publish(repo, 1)
    router.refresh()
    built[0].down = True
    routed = asyncio.run(router.route("hi"))
    assert routed.fallback and routed.model_version is None and routed.model_name == "rules"


def test_a_fallback_looks_for_a_newer_version_at_once(setup):
    router, ready, built, _seen, repo = setup
    publish(repo, 1)
    router.refresh()
    built[0].down = True  # Triton unloaded version 1 for version 2 ...
    publish(repo, 2)
    ready[2] = True  # ... which it serves now

    async def scenario():
        first = await router.route("q")
        await router._kick
        return first, await router.route("q")

    first, second = asyncio.run(scenario())
    assert first.fallback
    assert not second.fallback and second.model_version == 2


def test_a_tenants_prior_shifts_its_decisions_and_reloads_when_refitted(setup):
    from adaptive_rag.routing.policy import RoutingPolicy
    from adaptive_rag.routing.tenant_priors import TenantPriors

    router, _ready, built, _seen, repo = setup
    publish(repo, 1)
    assert router.refresh()
    built[-1].policy = RoutingPolicy()
    query = "Who makes Lumora lamps?"
    assert asyncio.run(router.route(query, "support")).tier is Tier.B  # no prior yet
    TenantPriors().with_tenant("support", (1.5, 0.0, 0.0)).save(repo / "complexity" / "1")
    assert router.refresh() is False  # same version, new priors
    shifted = asyncio.run(router.route(query, "support"))
    assert shifted.tier is Tier.A and "tenant prior r1" in shifted.reason
    assert shifted.model_version == 1 and not shifted.fallback
    assert asyncio.run(router.route(query, "acme")).tier is Tier.B  # other tenants untouched
    (repo / "complexity" / "1" / "tenant_priors.json").write_text("{not json", encoding="utf-8")
    router.refresh()  # a broken file keeps the priors in use
    assert asyncio.run(router.route(query, "support")).tier is Tier.A
