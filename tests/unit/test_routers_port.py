"""Every router of `adaptive_rag.routers` is usable through the one port, `Router.route(query)`."""

from __future__ import annotations

from fakes import FakeLLM

from adaptive_rag.contracts import RoutingDecision, Tier
from adaptive_rag.routers import Router
from adaptive_rag.routers.llm_judge import LLMJudge
from adaptive_rag.routing.rules import rules_router
from adaptive_rag.training.learned_routers import KnnRouter, LabelledQuery
from tests.support.encoders import HashingEmbedder


class RulesOnly:
    def route(self, query: str) -> RoutingDecision:
        return rules_router(query)


def test_the_routers_answer_through_the_port() -> None:
    knn = KnnRouter(HashingEmbedder())
    knn.fit([LabelledQuery(f"{word} question {i}", Tier(tier)) for i in range(60)
             for word, tier in (("hello", "A"), ("who", "B"), ("compare", "C"))])
    routers: list[Router] = [knn, LLMJudge(FakeLLM(["C"])), RulesOnly()]
    for router in routers:
        assert isinstance(router, Router)
        assert isinstance(router.route("compare Paris and Rome"), RoutingDecision)
    assert [r.route("compare Paris and Rome").tier for r in routers[::2]] == [Tier.C, Tier.C]


def test_something_without_route_is_no_router() -> None:
    assert not isinstance(rules_router, Router)  # a bare function: wrap it, as `RulesOnly` does
