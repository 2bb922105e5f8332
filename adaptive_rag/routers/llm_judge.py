"""A router that asks the generator itself: the LLM reads the question and one-line descriptions of
tiers A/B/C (`prompts.router_judge`) and answers with a letter.

Its overhead is one LLM call per query before any answering starts (on the embedded model, far
more than the classifier's few milliseconds), so the time it took travels in the decision's
`classify_ms`. An answer that names no tier goes to B, the safe middle, with reason "unparsed";
a failing LLM does too, flagged as a fallback. `AsyncLLMJudge` is the front door's `Router` port.
"""

from __future__ import annotations

import asyncio
import re
import time
from dataclasses import dataclass

from adaptive_rag.contracts import RoutingDecision, Tier
from adaptive_rag.ports import LLM
from adaptive_rag.prompts import router_judge as prompt
from adaptive_rag.strategies.base import ask

MODEL_NAME = "llm-judge"
DEFAULT_TIER = Tier.B
UNPARSED = "unparsed"

# A leading "Tier", "Option", "Answer" or "Route" with its separator ("Tier: C", "answer - b").
_LEAD = re.compile(r"^\W*(?:tier|option|answer|route)?\s*[:\-=]?\s*", re.IGNORECASE)
# A capital letter as its own word: "C", "(C)", "C) multi", "B - single step" (but an "A"
# followed by a lower-case word is the article: "A simple question").
_ARTICLE = r"(?!\s+[a-z])"
_UPPER = re.compile(rf"^\(?([BC]\b|A\b{_ARTICLE})")
# A lower-case letter only with a delimiter after it ("c)", "b.", "a"), never "a simple ...".
_LOWER = re.compile(r"^\(?([abc])\s*(?:$|[).:,\]]|-\s)")
_NAMED = re.compile(r"\btier\s*[:\-]?\s*\(?([abc])\b", re.IGNORECASE)
# Last resort: a capital letter standing alone anywhere on the first line ("I would pick C.").
_ALONE = re.compile(rf"(?<![\w'])([BC]|A{_ARTICLE})(?![\w'])")
_DESCRIBED = {
    Tier.A: re.compile(r"\bno[\s-]retrieval\b", re.IGNORECASE),
    Tier.B: re.compile(r"\bsingle[\s-]step\b", re.IGNORECASE),
    Tier.C: re.compile(r"\bmulti[\s-]?step\b", re.IGNORECASE),
}


def parse_tier(text: str) -> Tier | None:
    """The tier the judge named, or None when its answer names none (or names several)."""
    line = next((ln.strip() for ln in text.splitlines() if ln.strip()), "")
    rest = _LEAD.sub("", line, count=1)
    found = _UPPER.match(rest) or _LOWER.match(rest) or _NAMED.search(text)
    if found:
        return Tier(found.group(1).upper())
    described = {tier for tier, pattern in _DESCRIBED.items() if pattern.search(text)}
    if len(described) == 1:
        return described.pop()
    alone = {match.group(1) for match in _ALONE.finditer(line)}
    return Tier(alone.pop()) if len(alone) == 1 else None


@dataclass
class LLMJudge:
    """`route(question)`: one LLM call, its letter, a `RoutingDecision` (model "llm-judge")."""

    llm: LLM
    model_name: str = MODEL_NAME

    def route(self, question: str) -> RoutingDecision:
        start = time.perf_counter()
        try:
            text = ask(self.llm, prompt.PROMPT, question=question).text
        except Exception as exc:  # noqa: BLE001 - a router never raises: the safe tier instead
            return RoutingDecision(
                tier=DEFAULT_TIER, model_name=self.model_name, fallback=True,
                reason=f"llm judge failed ({type(exc).__name__}); {DEFAULT_TIER.value} instead",
                classify_ms=1000 * (time.perf_counter() - start),
            )
        tier = parse_tier(text)
        elapsed_ms = 1000 * (time.perf_counter() - start)
        if tier is None:
            return RoutingDecision(
                tier=DEFAULT_TIER, model_name=self.model_name,
                reason=f"{UNPARSED}: {text.strip()[:80]!r}; {DEFAULT_TIER.value} instead",
                classify_ms=elapsed_ms,
            )
        return RoutingDecision(
            tier=tier, model_name=self.model_name, reason=f"llm judge answered {text.strip()[:40]!r}",
            classify_ms=elapsed_ms,
        )

    def as_async(self) -> AsyncLLMJudge:
        return AsyncLLMJudge(self)


@dataclass
class AsyncLLMJudge:
    """The judge behind the front door's `Router` port: the blocking LLM call runs in a thread so
    the event loop stays free."""

    judge: LLMJudge

    async def route(self, query: str) -> RoutingDecision:
        return await asyncio.to_thread(self.judge.route, query)
