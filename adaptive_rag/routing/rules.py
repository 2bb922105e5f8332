"""Rule-based routers.

`rule_tier`, the question-form rules (the fallback when the classifier cannot be reached):
greetings and very short chit-chat -> A; comparison or multi-part signals ("compare",
"difference between", "versus", "both", "each of", "X-er ... or ...", "... and which ...", more
than one question mark) -> C; else B.

`escalate_several_things`: a query that asks several things (`routing.question_parts`: several
questions in the ways people write them, or a comparison) needs more than one look-up, so serving
escalates it to C whatever the classifier says: the benchmark the classifier learned from has almost
none (1 of 4,150 `train` questions), and the shipped router sent half of the demo's two-part
questions to single step.

`rules_router`: the rules as a router of their own (the "adaptive, rules only" row, `ARAG_ROUTER=rules`).
"""

from __future__ import annotations

import re

from adaptive_rag.contracts import RoutingDecision, Tier
from adaptive_rag.routing.question_parts import asks_several_things, question_parts

__all__ = ["asks_several_things", "escalate_several_things", "question_parts", "rule_tier", "rules_router"]

_GREETING = re.compile(
    r"^\s*(hi|hello|hey|thanks|thank you|good (morning|afternoon|evening)|bye|goodbye)\b",
    re.IGNORECASE,
)
_MULTI_PART = re.compile(
    r"\b(compare|comparison|difference between|differences between|versus\b|vs\b\.?|both\b|each of|"
    r"which (one )?(is|was|has|had|came|were) (more|less|older|younger|first|earlier|later|bigger|larger|smaller|higher|lower)|"
    r"(first|older|younger|earlier|later|longer|shorter|more|fewer|larger|bigger|smaller|higher|lower)\b.*\bor\b|"
    r"\band (of|what|which|who|whom|when|where|how|why)\b)",
    re.IGNORECASE,
)
_QUESTION_WORD = re.compile(r"\b(what|which|who|whom|whose|when|where|why|how)\b", re.IGNORECASE)
SHORT_WORDS = 3


def rule_tier(query: str) -> Tier:
    """The tier the rules assign to `query`."""
    greeting = _GREETING.match(query)
    rest = query[greeting.end():] if greeting else query
    if greeting and not _QUESTION_WORD.search(rest):
        return Tier.A  # chit-chat; "Hi, how long is ...?" is routed on the question after it
    if len(rest.split()) <= SHORT_WORDS and "?" not in rest:
        return Tier.A
    if query.count("?") > 1 or _MULTI_PART.search(rest) or asks_several_things(rest):
        return Tier.C
    return Tier.B


def escalate_several_things(query: str, decision: RoutingDecision) -> RoutingDecision:
    """`decision` moved to C when `query` asks several things (unchanged otherwise, or when C)."""
    if decision.tier is Tier.C or not asks_several_things(query):
        return decision
    return decision.model_copy(update={
        "tier": Tier.C, "strategy": "",
        "reason": f"{decision.reason}; several questions in one: C".lstrip("; "),
    })


def rules_router(query: str) -> RoutingDecision:
    """The rule classifier as a router (the "adaptive, rules only" row): the rules' tier, not
    flagged as a fallback."""
    return RoutingDecision(tier=rule_tier(query), reason="rules")
