"""What every answering strategy shares: the protocol, answer clean-up, phase timing (each phase
a span of the current trace) and token usage."""

from __future__ import annotations

import re
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Protocol

from adaptive_rag import tracing
from adaptive_rag.domain import Completion, Passage, StrategyResult, Usage
from adaptive_rag.ports import LLM
from adaptive_rag.prompts import Prompt

# The usage meters open around the running code (`metered`); every `ask` adds to each of them.
_METERS: ContextVar[tuple[Usage, ...]] = ContextVar("arag_usage_meters", default=())


class Strategy(Protocol):
    """Answers one question; `name` is recorded with every result."""

    name: str

    def run(self, question: str) -> StrategyResult: ...


def ask(llm: LLM, prompt: Prompt, **fields: str) -> Completion:
    """Run one prompt in the form the generator wants: chat for instruction models, few-shot
    completion for base models."""
    if getattr(llm, "prompt_style", "completion") == "chat":
        completion = llm.chat(prompt.messages(**fields), prompt.max_tokens, prompt.chat_stop)
    else:
        completion = llm.generate(prompt.text(**fields), prompt.max_tokens, prompt.stop)
    for meter in _METERS.get():
        meter.add(completion)
    tracing.annotate(**{tracing.INPUT_TOKENS: completion.prompt_tokens,
                        tracing.OUTPUT_TOKENS: completion.completion_tokens})
    return completion


@contextmanager
def metered() -> Iterator[Usage]:
    """The tokens of every `ask` inside the block (nested blocks each count their own)."""
    usage = Usage()
    token = _METERS.set((*_METERS.get(), usage))
    try:
        yield usage
    finally:
        _METERS.reset(token)


@contextmanager
def metered_alone() -> Iterator[Usage]:
    """The tokens of every `ask` inside the block, counted there only: for a call run in another
    thread, whose tokens the caller adds to its own meters when it returns (`add_usage`), so no
    two threads add to one meter at once."""
    usage = Usage()
    token = _METERS.set((usage,))
    try:
        yield usage
    finally:
        _METERS.reset(token)


def add_usage(usage: Usage | None) -> None:
    """Add `usage` (a `metered_alone` block's) to every meter open here."""
    if usage is None:
        return
    for meter in _METERS.get():
        meter.merge(usage)


def run_metered(strategy: Strategy, question: str) -> StrategyResult:
    """`strategy.run(question)` in a span, with the tokens it spent in `result.usage` (summed
    here once, so no strategy has to carry counts through its own steps)."""
    with tracing.span(f"strategy {strategy.name}", strategy=strategy.name) as current, metered() as usage:
        result = strategy.run(question)
        result.usage = usage
        if current.is_recording():
            current.set_attributes({"steps": result.steps, "llm_calls": usage.llm_calls,
                                    tracing.INPUT_TOKENS: usage.prompt_tokens,
                                    tracing.OUTPUT_TOKENS: usage.completion_tokens})
    return result


# "Answer:", "Answer -", "So the answer is:", "A:" (but not the "A-" of "A-ha").
_ANSWER_PREFIX = re.compile(r"^\s*(answer|so the answer is)\s*[:\-]\s*|^\s*a\s*:\s*", re.IGNORECASE)


def clean_answer(text: str) -> str:
    """First line of the model's output without an 'Answer:' prefix, quotes or final period."""
    line = next((ln for ln in text.strip().splitlines() if ln.strip()), "")
    line = _ANSWER_PREFIX.sub("", line).strip()
    return line.strip().rstrip(".").strip("*\"' ").strip()


class PhaseTimer:
    """Accumulates wall-clock seconds per phase ('retrieve', 'generate') and in total; each phase
    is also a span (`step`: its count within the run), so a trace shows every step."""

    def __init__(self) -> None:
        self.timings: dict[str, float] = {}
        self._steps: dict[str, int] = {}
        self._start = time.perf_counter()

    @contextmanager
    def phase(self, name: str) -> Iterator[None]:
        step = self._steps[name] = self._steps.get(name, 0) + 1
        start = time.perf_counter()
        try:
            with tracing.span(name, step=step):
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
