"""The answering strategies and the mapping from tier to strategy."""

from __future__ import annotations

from adaptive_rag.contracts import AnswerStyle, StrategyName, Tier
from adaptive_rag.errors import ConfigurationError
from adaptive_rag.ports import LLM, Retriever
from adaptive_rag.settings import Settings, multi_step_strategy, strategy_knob
from adaptive_rag.strategies.abstention import Abstention
from adaptive_rag.strategies.base import Strategy
from adaptive_rag.strategies.decompose import Decompose
from adaptive_rag.strategies.evidence import EvidenceRead
from adaptive_rag.strategies.ircot import IRCoT
from adaptive_rag.strategies.no_retrieval import NoRetrieval
from adaptive_rag.strategies.parts import PartsInParallel
from adaptive_rag.strategies.self_route import SelfRoute
from adaptive_rag.strategies.single_step import SingleStep
from adaptive_rag.strategies.small_talk import SmallTalkReply
from adaptive_rag.strategies.uncertainty import Uncertainty

STRATEGY_NAMES = (
    StrategyName.NO_RETRIEVAL, StrategyName.SINGLE_STEP, StrategyName.IRCOT, StrategyName.DECOMPOSE,
    StrategyName.EVIDENCE,
)
# Cost order, cheapest first: used to pick the cheapest correct strategy (oracle, labels).
COST_RANK = {name: rank for rank, name in enumerate(STRATEGY_NAMES)}
# Strategies that route inside themselves, escalating on the LLM's own signal (the reader
# abstains, the draft is unsure): compared with the routers, never a tier or a label.
SELF_ROUTING_NAMES = (StrategyName.SELF_ROUTE, StrategyName.UNCERTAINTY)
ALL_STRATEGY_NAMES = (*STRATEGY_NAMES, *SELF_ROUTING_NAMES)


def strategy_for_tier(tier: Tier, settings: Settings) -> StrategyName:
    """Tier A -> no retrieval, B -> single step, C -> the configured multi-step variant."""
    return {Tier.A: StrategyName.NO_RETRIEVAL, Tier.B: StrategyName.SINGLE_STEP,
            Tier.C: multi_step_strategy(settings)}[tier]


# Tier A's answer to a recognised small-talk turn (chosen at admission, not by the classifier).
SMALL_TALK = StrategyName.SMALL_TALK
# Strategies that never search the knowledge base (a tenant without one could still run them).
RETRIEVAL_FREE = frozenset({StrategyName.NO_RETRIEVAL, StrategyName.SMALL_TALK})


def uses_retrieval(name: str) -> bool:
    return name not in RETRIEVAL_FREE


def deployment_abstention(settings: Settings) -> Abstention:
    """The thresholds that hold without a knowledge base's own: the settings' (0 where unset)."""
    return Abstention(min_relevance=settings.abstain_min_relevance or 0.0,
                      min_score=settings.abstain_min_score)


def build_strategy(name: str, retriever: Retriever, llm: LLM, settings: Settings,
                   abstention: Abstention | None = None,
                   style: AnswerStyle = AnswerStyle.SHORT) -> Strategy:
    """Instantiate a strategy by name (`ALL_STRATEGY_NAMES` or `SMALL_TALK`) with the settings'
    bounds.

    `abstention`: when the retrieving strategies abstain (the worker passes the tenant's
    thresholds in effect); None: `deployment_abstention(settings)`. `style`: how the retrieving
    strategies' reader answers (the worker passes the tenant's; evaluation reads `short`).
    `uncertainty` drafts on a log-probability generator: `llm` when it reports them, else the
    process's shared log-probability copy of the configured model (`llm.logprob_llm`).
    """
    abstention = abstention if abstention is not None else deployment_abstention(settings)
    if name == StrategyName.NO_RETRIEVAL:
        return NoRetrieval(llm)
    if name == StrategyName.SMALL_TALK:
        return SmallTalkReply()
    if name == StrategyName.SINGLE_STEP:
        return SingleStep(
            retriever, llm, top_k=settings.top_k, abstention=abstention,
            reader_abstains=settings.reader_abstains, style=style,
            abstain_min_confidence=settings.reader_abstain_min_confidence,
            evidence_tokens=settings.evidence_tokens or None,
        )
    if name == StrategyName.SELF_ROUTE:
        single = SingleStep(
            retriever, llm, top_k=settings.top_k, abstention=abstention, reader_abstains=True,
            style=style, evidence_tokens=settings.evidence_tokens or None,
        )
        return SelfRoute(single, build_strategy(multi_step_strategy(settings), retriever, llm, settings,
                                                abstention, style))
    if name == StrategyName.UNCERTAINTY:
        from adaptive_rag.llm import logprob_llm

        return Uncertainty(
            logprob_llm(settings, llm),
            build_strategy(StrategyName.SINGLE_STEP, retriever, llm, settings, abstention, style),
            threshold=settings.uncertainty_threshold, aggregate=settings.uncertainty_aggregate,
        )
    whole: Strategy | None = None
    if name == StrategyName.IRCOT:
        whole = IRCoT(
            retriever, llm, top_k=settings.top_k, max_steps=settings.max_steps,
            max_passages=strategy_knob(settings, "ircot_max_passages") or settings.max_passages,
            query_with_question=strategy_knob(settings, "ircot_query_with_question"),
            min_steps=strategy_knob(settings, "ircot_min_steps"),
            reader_answers=strategy_knob(settings, "ircot_reader_answers"), abstention=abstention,
            style=style,
        )
    elif name == StrategyName.DECOMPOSE:
        whole = Decompose(
            retriever, llm, top_k=settings.top_k, max_passages=settings.max_passages,
            question_hits_first=strategy_knob(settings, "decompose_question_hits_first"),
            abstention=abstention, style=style,
        )
    elif name == StrategyName.EVIDENCE:
        from adaptive_rag.evidence.graphs import shared_graphs

        whole = EvidenceRead(
            retriever, llm, gatherer=settings.evidence_gatherer, budget=settings.evidence_budget,
            graphs=shared_graphs(settings.evidence_graphs), abstention=abstention,
            reader_abstains=settings.reader_abstains,
            evidence_tokens=strategy_knob(settings, "evidence_read_tokens") or None,
            compare_sides=settings.evidence_compare_sides,
        )
    if whole is not None:
        if not settings.answer_parts:
            return whole
        # Parts read at once on an LLM server's slots; a model in this process reads in turn.
        return PartsInParallel(retriever, llm, whole, top_k=settings.top_k, abstention=abstention,
                               reader_abstains=settings.reader_abstains, style=style,
                               parallel=2 if settings.llm_base_url else 1,
                               evidence_tokens=settings.evidence_tokens or None)
    raise ConfigurationError(
        f"unknown strategy {name!r}; choose one of {', '.join((*ALL_STRATEGY_NAMES, SMALL_TALK))}")


__all__ = [
    "ALL_STRATEGY_NAMES", "Abstention", "COST_RANK", "SELF_ROUTING_NAMES", "SMALL_TALK", "STRATEGY_NAMES",
    "Decompose", "EvidenceRead", "IRCoT", "NoRetrieval", "PartsInParallel", "SelfRoute", "SingleStep", "SmallTalkReply",
    "Strategy", "Uncertainty",
    "build_strategy", "deployment_abstention", "strategy_for_tier", "uses_retrieval",
]
