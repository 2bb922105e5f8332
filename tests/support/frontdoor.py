"""Stand-ins for the front door's router and knowledge-base check, for tests whose subject is the
path after routing (workers, broker, records): every query goes to one tier, every tenant has a
knowledge base."""

from __future__ import annotations

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
