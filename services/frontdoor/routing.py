"""Which router the front door asks for each query's tier (`ARAG_ROUTER`).

`ARAG_ROUTER=classifier` (default): the fine-tuned classifier served by Triton, swapped to each
newly served version without a restart (`adaptive_rag.routing.hot_swap.ClassifierRouter`). The
other routers of the evaluation (`adaptive_rag.routers`) can serve too: `rules` (the question-form
rules), `lr`, `knn`, `reward` (the learned routers, loaded from `ARAG_ROUTER_DIR`, default
`var/routers/<kind>`, run in-process), `llm-judge` (the reader chooses from the tiers'
descriptions: an LLM call per query), `self-route` and `uncertainty` (no router: every query
enters at B, or A, and the strategy escalates by itself). Each is wrapped in `FixedRouter`, which
has nothing to swap.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from adaptive_rag.routers.self_routing import SELF_ROUTING_POLICIES, self_routing_policy
from adaptive_rag.routing.hot_swap import ClassifierRouter, FixedRouter
from adaptive_rag.settings import Settings


def open_router(
    kind: str, directory: Path | None, library: Settings, classifier: Callable[[], ClassifierRouter]
) -> ClassifierRouter | FixedRouter:
    """The configured router; `classifier` builds the Triton one (the default)."""
    if kind == "classifier":
        return classifier()
    if kind == "rules":
        return FixedRouter("rules")
    if kind in SELF_ROUTING_POLICIES:
        return FixedRouter(kind, self_routing_policy(kind))
    if kind == "llm-judge":
        from adaptive_rag.llm import build_llm
        from adaptive_rag.routers.llm_judge import LLMJudge

        return FixedRouter("llm-judge", LLMJudge(build_llm(library)).as_async())
    from adaptive_rag.routers.learned import open_router as open_learned

    learned = open_learned(kind, directory or Path("var/routers") / kind, threads=1)
    return FixedRouter(learned.model_name, learned)
