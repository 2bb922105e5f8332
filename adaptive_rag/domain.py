"""Plain value types of the strategies and their ports (the serving messages are in `contracts`)."""

from __future__ import annotations

from dataclasses import dataclass, field

@dataclass(frozen=True, slots=True)
class Passage:
    """One retrievable unit of the knowledge base."""

    id: str
    title: str
    text: str
    score: float = 0.0
    # A knowledge-base chunk's document and section (empty for benchmark corpus paragraphs).
    doc_id: str = ""
    section: str = ""


@dataclass(frozen=True, slots=True)
class Completion:
    """What an LLM backend returned for one prompt."""

    text: str
    prompt_tokens: int = 0
    completion_tokens: int = 0
    # Per generated token log-probabilities, when the backend reports them.
    token_logprobs: list[float] | None = None


@dataclass(slots=True)
class Usage:
    """LLM tokens one strategy run spent, summed over its generations (what a run costs)."""

    prompt_tokens: int = 0
    completion_tokens: int = 0
    llm_calls: int = 0

    def add(self, completion: Completion) -> None:
        self.prompt_tokens += completion.prompt_tokens
        self.completion_tokens += completion.completion_tokens
        self.llm_calls += 1

    def merge(self, other: Usage) -> None:
        """Add the tokens and calls of another run's meter (a thread's, `metered_alone`)."""
        self.prompt_tokens += other.prompt_tokens
        self.completion_tokens += other.completion_tokens
        self.llm_calls += other.llm_calls


@dataclass(slots=True)
class StrategyResult:
    """The outcome of running one answering strategy on one question."""

    strategy: str
    answer: str
    steps: int
    passages: list[Passage] = field(default_factory=list)
    # Seconds spent per phase (e.g. "retrieve", "generate", "total").
    timings: dict[str, float] = field(default_factory=dict)
    # Free-form trace (reasoning sentences, sub-questions) for debugging and reports.
    trace: list[str] = field(default_factory=list)
    # False when the strategy declined to answer from the knowledge base (support semantics):
    # `abstain_reason` says why (no passage above the retrieval threshold, or the reader said the
    # passages do not contain the answer). Clients hand those to a human.
    answerable: bool = True
    abstain_reason: str = ""
    # Tokens of every generation of the run (`strategies.base.run_metered` fills it in).
    usage: Usage = field(default_factory=Usage)
