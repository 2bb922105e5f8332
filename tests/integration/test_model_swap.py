"""A promotion and a rollback against the real local Triton (EXPLICIT model control, the
repository's own config.pbtxt) while the front door's router routes without pause: not one
decision falls back to the rules, and the router moves 1 -> 2 -> 1 as `served.json` does.

The router is the front door's own `ClassifierRouter`, which follows the served pointer. The models
are the length routers of `lab/harness/models.py` (cheap, real ONNX graphs). The same swap through
the gRPC front door under client traffic: tests/e2e/test_model_swap_e2e.py.
"""

from __future__ import annotations

import asyncio
import time

import pytest

from adaptive_rag.contracts import CLASSIFIER_MODEL
from adaptive_rag.routing.model_repository import config_pbtxt
from adaptive_rag.settings import ClassifierSettings
from adaptive_rag.storage import PromotionStore, make_engine, upgrade_database
from adaptive_rag.training.promotion import promote_candidate, rollback
from services.classifier.local import TritonProcess
from adaptive_rag.routing.hot_swap import ClassifierRouter
from lab.harness.models import publish_length_router

pytestmark = pytest.mark.integration

GOOD, BAD = -20.0, 50.0
LABELLED = [
    ("hi", "A"), ("hello there", "A"), ("thanks a lot", "A"),
    ("How long is the warranty of the Hub H2 device?", "B"),
    ("Does the Flex Strip work with Alexa and Google Home?", "B"),
    ("How do I reset the motion sensor?", "B"),
    (("Compare the Hub H2 and the Bridge Mini in price, range, power draw, supported protocols and "
      "the warranty that each of them comes with."), "C"),
]
TEXTS, LABELS = [t for t, _ in LABELLED], [label for _, label in LABELLED]


async def _until(predicate, timeout_s: float = 60.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        assert time.monotonic() < deadline, "timed out"
        await asyncio.sleep(0.05)


def test_promotion_and_rollback_swap_versions_without_a_fallback(tmp_path):
    repo = tmp_path / "repo"
    publish_length_router(repo, 1, BAD)
    (repo / CLASSIFIER_MODEL / "config.pbtxt").write_text(config_pbtxt())
    candidate = publish_length_router(tmp_path / "candidate", 1, GOOD)
    url = f"sqlite:///{tmp_path / 'records.db'}"
    upgrade_database(url)
    store = PromotionStore(make_engine(url))

    with TritonProcess(repo, tmp_path / "triton.log") as triton:
        settings = ClassifierSettings(_env_file=None, model_repository=repo, triton_grpc_url=triton.url,
                                      classifier_timeout_s=2.0)
        router = ClassifierRouter(settings, poll_s=0.1)
        assert router.refresh() and router.version == 1
        decisions = []
        timeline = []

        async def drive() -> None:
            stop = asyncio.Event()

            async def traffic() -> None:
                n = 0
                while not stop.is_set():
                    decisions.append(await router.route(TEXTS[n % len(TEXTS)]))
                    n += 1

            async def poll() -> None:  # the front door's poll_forever, faster
                while not stop.is_set():
                    await asyncio.to_thread(router.refresh)
                    await asyncio.sleep(0.1)

            async def operator() -> None:
                try:
                    await asyncio.sleep(1.0)
                    verdict = await asyncio.to_thread(
                        promote_candidate, candidate, repo, TEXTS, LABELS, store=store,
                        triton_urls=[triton.url])
                    timeline.append(("promoted", len(decisions), verdict.verdict, verdict.reason))
                    assert verdict.promoted and verdict.version == 2, verdict.reason
                    await _until(lambda: router.version == 2)
                    await asyncio.sleep(1.0)
                    served = await asyncio.to_thread(rollback, repo, store=store, triton_urls=[triton.url])
                    timeline.append(("rolled back", len(decisions), served))
                    await _until(lambda: router.version == 1)
                    await asyncio.sleep(1.0)
                finally:
                    stop.set()

            await asyncio.gather(traffic(), poll(), operator())

        try:
            asyncio.run(drive())
        finally:
            router.close()

    fallbacks = [d for d in decisions if d.fallback]
    assert not fallbacks, (len(fallbacks), fallbacks[0].reason, timeline)
    assert len(decisions) > 100, timeline
    # The versions that answered, in order: 1, then 2 after the promotion, then 1 again.
    runs = [decisions[0].model_version]
    for d in decisions:
        if d.model_version != runs[-1]:
            runs.append(d.model_version)
    assert runs == [1, 2, 1], (runs, timeline)
    print(f"{len(decisions)} decisions routed, versions {runs}, none from the rules; {timeline}")
    assert [(r.action, r.verdict) for r in store.recent(CLASSIFIER_MODEL)] == [
        ("rollback", "rolled_back"), ("promote", "promoted")]
