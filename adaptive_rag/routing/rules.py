"""Rule-based routers.

`rule_tier`, the question-form rules (the fallback when the classifier cannot be reached):
greetings and very short chit-chat -> A; comparison or multi-part signals ("compare",
"difference between", "versus", "both", "each of", "X-er ... or ...", "... and which ...", more
than one question mark) -> C; else B.

`asks_two_questions`: a second question after the first ("X? And y?", "..., and which ...?",
"..., and can I ...?"), or one question about two things ("the brightness of X and of Y?").
Each part needs its own look-up, so serving escalates such a query to C whatever the classifier
says: the benchmark the classifier learned from has almost none (1 of 4,150 `train` questions),
and the shipped router sent half of the demo's two-part questions to single step.

`rules_router`: the rules as a router of their own (the "adaptive, rules only" row, `ARAG_ROUTER=rules`).
"""

from __future__ import annotations

import re

from adaptive_rag.contracts import RoutingDecision, Tier

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
_SECOND_QUESTION = re.compile(
    r"\?\s+(and|also)\s+\S[^?]*\?|[,;]\s+and\s+(then\s+)?(what|which|who|whom|whose|when|where|why|how)\b"
    # ", and can they ...?": a yes/no question after the first (the query ends with its "?")
    r"|[,;]\s+and\s+(can|could|will|would|is|are|does|do|did|should|may)\s+[^?]*\?\s*$",
    re.IGNORECASE,
)
# One question about two things, the preposition repeated: "the brightness of the A19 bulb and of
# the Flex Strip?" -> "... of the A19 bulb?", "... of the Flex Strip?".
# A wh-question only ("Is the population of X and of Y larger ...?" goes on after Y), and the
# second object is no question of its own ("... in 1995 and in which country ...?").
_TWO_OBJECTS = re.compile(
    r"^(?P<ask>(what|which|who|whom|whose|when|where|how)\b.+?\b(?P<prep>of|for|in|on))\s+(?P<first>.+?)"
    r"\s+and\s+(?P=prep)\s+(?!(what|which|who|whom|whose|when|where|why|how)\b)(?P<second>[^,;]+?)\s*\?\s*$",
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
    if query.count("?") > 1 or _MULTI_PART.search(rest):
        return Tier.C
    return Tier.B


def asks_two_questions(query: str) -> bool:
    """True when `query` asks a second question after the first ("X? And y?", "..., and what ...",
    "..., and can I ...?") or one question about two things ("... of X and of Y?")."""
    return _SECOND_QUESTION.search(query) is not None or _TWO_OBJECTS.match(query) is not None


def question_parts(query: str) -> list[str]:
    """The parts of a query that asks two questions: the text before the second question and the
    second question ("X? And y?" -> ["X?", "y?"]; "..., and what ..." -> ["...", "what ..."]);
    `[query]` when it asks one. Each part is a question of its own to look up."""
    match = _SECOND_QUESTION.search(query)
    if match is None:
        objects = _TWO_OBJECTS.match(query)
        if objects is None:
            return [query]
        return [f"{objects['ask']} {objects['first']}?", f"{objects['ask']} {objects['second']}?"]
    first = query[: match.start() + (1 if match.group(0).startswith("?") else 0)].strip(" ,;")
    second = query[match.start():].lstrip("?,; ").strip()
    second = re.sub(r"^(and|also)\s+(then\s+)?", "", second, flags=re.IGNORECASE)
    return [part for part in (first, second) if part] or [query]


def escalate_two_questions(query: str, decision: RoutingDecision) -> RoutingDecision:
    """`decision` moved to C when `query` asks two questions (unchanged otherwise, or when C)."""
    if decision.tier is Tier.C or not asks_two_questions(query):
        return decision
    return decision.model_copy(update={
        "tier": Tier.C, "strategy": "",
        "reason": f"{decision.reason}; two questions in one: C".lstrip("; "),
    })


def rules_router(query: str) -> RoutingDecision:
    """The rule classifier as a router (the "adaptive, rules only" row): the rules' tier, not
    flagged as a fallback."""
    return RoutingDecision(tier=rule_tier(query), reason="rules")
