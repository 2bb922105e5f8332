"""The routers the product is compared with, each behind one port, `Router`.

Beside the served classifier (`adaptive_rag.routing`: Triton client, policy, rules), these route
in-process for the evaluation and can serve through the front door's `FixedRouter`:
`local_classifier` (an exported classifier version through ONNX Runtime), `learned` (logistic
regression, kNN and cost-aware reward regression over sentence embeddings from `embeddings`),
`llm_judge` (the reader picks the tier) and `self_routing` (the strategy escalates by itself).
Fitting them lives in `adaptive_rag.training`, judging them in `adaptive_rag.evaluation`.
"""

from __future__ import annotations

from typing import Protocol, runtime_checkable

from adaptive_rag.contracts import RoutingDecision


@runtime_checkable
class Router(Protocol):
    """The router port: a query in, its routing decision out (a tier, and why)."""

    def route(self, query: str) -> RoutingDecision: ...
