"""The "adaptive" evaluation rows without extra LLM runs.

`arag eval` already runs every tier's strategy on every question; an adaptive row is then, per
question, the outcome of the tier the router picked, with the routing time added. Routers:
`LocalOnnxClassifier` (the exported model in-process through ONNX Runtime + the policy; same
numbers as Triton, no server needed), `TritonClassifier` (served), or the rules
(`rules_router`).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import replace

import numpy as np

from adaptive_rag.classifier.client import QueryTokenizer, softmax_rows
from adaptive_rag.classifier.repository import ModelVersion
from adaptive_rag.domain import Tier
from adaptive_rag.evaluation.datasets import Question
from adaptive_rag.evaluation.runner import Outcome
from adaptive_rag.routing.policy import RoutingDecision, RoutingPolicy, fallback_decision

Router = Callable[[str], RoutingDecision]


def rules_router(query: str) -> RoutingDecision:
    """The rule classifier as a router (the "adaptive, rules only" row)."""
    decision = fallback_decision(query, "rules only")
    return replace(decision, fallback=False, reason="rules")


class LocalOnnxClassifier:
    """An exported model version run in-process: tokenize -> ONNX Runtime -> softmax -> policy."""

    def __init__(self, version: ModelVersion, policy: RoutingPolicy | None = None, threads: int = 1) -> None:
        import onnxruntime as ort

        options = ort.SessionOptions()
        options.intra_op_num_threads = threads
        self.session = ort.InferenceSession(
            str(version.onnx_path), options, providers=["CPUExecutionProvider"]
        )
        self.tokenize = QueryTokenizer(version.tokenizer_path, version.max_length)
        self.policy = policy or RoutingPolicy(version.thresholds())
        self.version = str(version.version)

    def probabilities(self, queries: Sequence[str]) -> np.ndarray:
        ids, mask = self.tokenize(queries)
        logits = self.session.run(["logits"], {"input_ids": ids, "attention_mask": mask})[0]
        return softmax_rows(logits)

    def classify(self, query: str) -> RoutingDecision:
        return self.policy.decide(self.probabilities([query])[0].tolist(), self.version)

    __call__ = classify


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
    counts = {"A": 0, "B": 0, "C": 0, "fallback": 0}
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
