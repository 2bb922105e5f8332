"""Tier A for small talk (greetings, thanks, "who are you"): the intent's short reply, no retrieval
and no LLM call, so a support tenant's "hi" costs microseconds and never gets a made-up answer."""

from __future__ import annotations

from dataclasses import dataclass

from adaptive_rag.contracts import StrategyName
from adaptive_rag.domain import StrategyResult
from adaptive_rag.routing.small_talk import REPLIES, small_talk_intent
from adaptive_rag.strategies.base import PhaseTimer

# A turn routed here that the detector no longer recognises (a newer detector on the worker).
DEFAULT_INTENT = "greeting"


@dataclass
class SmallTalkReply:
    name: str = StrategyName.SMALL_TALK

    def run(self, question: str) -> StrategyResult:
        timer = PhaseTimer()
        with timer.phase("generate"):
            found = small_talk_intent(question)
            reply = found.reply if found else REPLIES[DEFAULT_INTENT]
        return StrategyResult(strategy=self.name, answer=reply, steps=0, timings=timer.finish(),
                              trace=[f"small talk: {found.intent if found else DEFAULT_INTENT}"])
