"""Serving a self-routing strategy as the routing policy (`ARAG_ROUTER=self-route | uncertainty`).

Self-Route and uncertainty-triggered retrieval decide per question, from the reader's own signal,
how much retrieval to spend; no classifier runs before them. As a policy, every query enters at
the strategy's entry tier with the strategy named in its decision, and the worker of that tier
runs it, escalation included:

- `self-route`: tier B runs the single step with an abstaining reader, and the multi-step
  strategy when the reader declares the passages insufficient;
- `uncertainty`: tier A drafts without retrieval, and runs the single step when the draft's token
  probabilities fall below the threshold tuned on `train` (`arag routers tune-uncertainty`).

The escalated work runs in the entry tier's worker pool, not on the dearer tier's queue: the
queues then separate queries by where they entered, not by what they cost, which is the price of
letting the reader decide.
"""

from __future__ import annotations

from dataclasses import dataclass

from adaptive_rag.contracts import RoutingDecision, StrategyName, Tier

# The policy's name (ARAG_ROUTER) -> (the strategy it serves, the tier every query enters at).
SELF_ROUTING_POLICIES: dict[str, tuple[StrategyName, Tier]] = {
    "self-route": (StrategyName.SELF_ROUTE, Tier.B),
    "uncertainty": (StrategyName.UNCERTAINTY, Tier.A),
}


@dataclass(frozen=True)
class SelfRoutingPolicy:
    """Every query to `tier`, answered by `strategy`, which escalates on the worker by itself."""

    name: str
    strategy: StrategyName
    tier: Tier

    async def route(self, query: str) -> RoutingDecision:
        return RoutingDecision(
            tier=self.tier, model_name=self.name, strategy=self.strategy,
            reason=f"{self.name}: {self.strategy} entered at {self.tier.value}; it escalates by itself",
        )


def self_routing_policy(name: str) -> SelfRoutingPolicy:
    """The policy called `name` (a key of `SELF_ROUTING_POLICIES`)."""
    try:
        strategy, tier = SELF_ROUTING_POLICIES[name]
    except KeyError:
        raise ValueError(f"no self-routing policy {name!r}; choose {', '.join(SELF_ROUTING_POLICIES)}") from None
    return SelfRoutingPolicy(name, strategy, tier)
