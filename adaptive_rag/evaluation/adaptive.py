"""The "adaptive" evaluation rows without extra LLM runs.

`arag eval` already runs every tier's strategy on every question; an adaptive row is then, per
question, the outcome of the tier the router picked, with the routing time added. Routers:
`adaptive_rag.routing.local_classifier.LocalOnnxClassifier` (the exported model in-process through ONNX Runtime + the policy; same
numbers as Triton, no server needed), `TritonClassifier` (served), or the rules
(`local_classifier.rules_router`).
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import replace

from adaptive_rag.contracts import Tier
from adaptive_rag.evaluation.datasets import Question
from adaptive_rag.evaluation.runner import Outcome
from adaptive_rag.routing.local_classifier import Router


def routed_outcomes(
    outcomes: Mapping[tuple[str, str, str], Outcome],
    questions: Iterable[Question],
    tiers: Sequence[str],
    router: Router,
    row_name: str = "adaptive",
) -> tuple[list[Outcome], dict[str, int]]:
    """Per question, the outcome of the routed tier's strategy, its time plus the routing time.

    `tiers` names the A, B, C strategies. Questions lacking any tier's outcome are skipped.
    Returns the outcomes and how many questions went to each tier (and how many were fallbacks).
    """
    chosen: list[Outcome] = []
    counts = {**{t.value: 0 for t in Tier}, "fallback": 0}
    for question in questions:
        per_tier = {t: outcomes.get((question.dataset, question.id, name)) for t, name in zip(Tier, tiers)}
        if any(o is None for o in per_tier.values()):
            continue
        start = time.perf_counter()
        decision = router(question.question)
        routing_s = time.perf_counter() - start
        picked = per_tier[decision.tier]
        counts[decision.tier.value] += 1
        counts["fallback"] += decision.fallback
        chosen.append(replace(picked, strategy=row_name, seconds=picked.seconds + routing_s,
                              trace=[*picked.trace, f"routed {decision.tier.value}: {decision.reason}"]))
    return chosen, counts
