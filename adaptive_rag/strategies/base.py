"""What every answering strategy shares: the protocol, answer clean-up and phase timing."""

from __future__ import annotations

import re
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Protocol

from adaptive_rag.domain import Completion, Passage, StrategyResult
from adaptive_rag.ports import LLM
from adaptive_rag.prompts import Prompt


class Strategy(Protocol):
    """Answers one question; `name` is recorded with every result."""

    name: str

    def run(self, question: str) -> StrategyResult: ...


def ask(llm: LLM, prompt: Prompt, **fields: str) -> Completion:
    """Run one prompt in the form the generator wants: chat for instruction models, few-shot
    completion for base models."""
    if getattr(llm, "prompt_style", "completion") == "chat":
        return llm.chat(prompt.messages(**fields), prompt.max_tokens, prompt.chat_stop)
    return llm.generate(prompt.text(**fields), prompt.max_tokens, prompt.stop)


# "Answer:", "Answer -", "So the answer is:", "A:" (but not the "A-" of "A-ha").
_ANSWER_PREFIX = re.compile(r"^\s*(answer|so the answer is)\s*[:\-]\s*|^\s*a\s*:\s*", re.IGNORECASE)


def clean_answer(text: str) -> str:
    """First line of the model's output without an 'Answer:' prefix, quotes or final period."""
    line = next((ln for ln in text.strip().splitlines() if ln.strip()), "")
    line = _ANSWER_PREFIX.sub("", line).strip()
    return line.strip().rstrip(".").strip("*\"' ").strip()


class PhaseTimer:
    """Accumulates wall-clock seconds per phase ('retrieve', 'generate') and in total."""

    def __init__(self) -> None:
        self.timings: dict[str, float] = {}
        self._start = time.perf_counter()

    @contextmanager
    def phase(self, name: str) -> Iterator[None]:
        start = time.perf_counter()
        try:
            yield
        finally:
            self.timings[name] = self.timings.get(name, 0.0) + time.perf_counter() - start

    def finish(self) -> dict[str, float]:
        self.timings["total"] = time.perf_counter() - self._start
        return self.timings


def merge_passages(
    kept: Sequence[Passage], new: Sequence[Passage], limit: int
) -> list[Passage]:
    """Add unseen `new` passages to `kept`, never exceeding `limit` passages in all.

    Earlier passages stay (they answered earlier hops); new ones fill the remaining room in their
    retrieval order.
    """
    merged = list(kept)
    seen = {p.id for p in merged}
    for passage in new:
        if len(merged) >= limit:
            break
        if passage.id not in seen:
            merged.append(passage)
            seen.add(passage.id)
    return merged
