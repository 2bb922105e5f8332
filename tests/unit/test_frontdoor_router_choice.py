"""`ARAG_ROUTER`: the front door serves any of the evaluated routers, not only the classifier."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from adaptive_rag.contracts import Tier
from adaptive_rag.routing.model_repository import MODEL_FILE, SERVED_FILE, ServedState
from adaptive_rag.settings import ClassifierSettings, Settings
from adaptive_rag.routing.hot_swap import ClassifierRouter, FixedRouter
from services.frontdoor.routing import open_router
from services.frontdoor.settings import FrontDoorSettings


def _never() -> ClassifierRouter:
    raise AssertionError("the classifier must not be built for this router")


def test_rules_serve_without_a_classifier() -> None:
    router = open_router("rules", None, Settings(), _never)
    assert isinstance(router, FixedRouter) and router.model_name == "rules"
    decision = asyncio.run(router.route("Which was released first, Heat or Ronin?"))
    assert decision.tier is Tier.C and not decision.fallback
    assert router.refresh() is False


def test_the_classifier_is_the_default(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("ARAG_ROUTER", raising=False)
    assert FrontDoorSettings().router == "classifier"
    built = []
    open_router("classifier", None, Settings(), lambda: built.append(1) or "classifier")
    assert built == [1]


def test_an_unknown_router_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ARAG_ROUTER", "astrology")
    with pytest.raises(ValueError, match="classifier"):
        FrontDoorSettings()


def test_a_missing_learned_router_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(Exception, match=str(tmp_path / "knn")):
        open_router("knn", tmp_path / "knn", Settings(), _never)


def test_the_classifier_follows_the_served_pointer_not_the_newest_version(tmp_path: Path) -> None:
    model_dir = tmp_path / "complexity"
    for version in (1, 2, 3):
        (model_dir / str(version)).mkdir(parents=True)
        (model_dir / str(version) / MODEL_FILE).write_bytes(b"onnx")
    router = ClassifierRouter(
        ClassifierSettings(model_repository=tmp_path, classifier_model="complexity"), 10.0,
    )
    assert router.published_versions() == [3]  # no pointer yet: the latest
    state = ServedState(version=2, history=(1, 3, 2), loaded=(3, 2), reason="rollback")
    (model_dir / SERVED_FILE).write_text(state.to_json())
    assert router.published_versions() == [2]


@pytest.mark.parametrize(("kind", "tier", "strategy"), [
    ("self-route", Tier.B, "self_route"), ("uncertainty", Tier.A, "uncertainty"),
])
def test_a_self_routing_strategy_serves_without_a_router(kind: str, tier: Tier, strategy: str,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ARAG_ROUTER", kind)
    assert FrontDoorSettings().router == kind
    router = open_router(kind, None, Settings(), _never)
    assert isinstance(router, FixedRouter) and router.model_name == kind
    decision = asyncio.run(router.route("Who directed the film that won the 1998 Palme d'Or?"))
    assert (decision.tier, decision.strategy, decision.model_name) == (tier, strategy, kind)
    assert not decision.fallback and decision.probabilities is None
