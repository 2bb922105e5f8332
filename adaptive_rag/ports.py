"""The two ports every strategy is written against.

Adapters live in `adaptive_rag.retrieval` and `adaptive_rag.llm`; strategies, the evaluation
harness, workers and tests only ever see these protocols.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Protocol, runtime_checkable

from adaptive_rag.domain import Completion, Passage


@runtime_checkable
class Retriever(Protocol):
    """Ranked lexical search over a knowledge base."""

    def search(self, query: str, k: int) -> list[Passage]:
        """Return at most `k` passages, best first; any user text is valid input.

        Must never raise on query syntax: operators, brackets, quotes, field prefixes or empty
        text give results or an empty list.
        """
        ...


@runtime_checkable
class QueryWeigher(Protocol):
    """A retriever that also says how much a query could owe to the knowledge base: the sum of
    the BM25 idf of its distinct analysed terms there (a term the knowledge base lacks counts
    with the largest idf). A passage's score over that weight is its relevance, which means the
    same on a knowledge base of 50 passages as on one of 50,000 (`retrieval.relevance`)."""

    def query_weight(self, query: str) -> float:
        """The summed idf of `query`'s terms in this index (0 for a query without terms)."""
        ...


@runtime_checkable
class LLM(Protocol):
    """A generator: text completion for base models, chat for instruction models.

    `prompt_style` says which of the two the strategies should use ("completion" or "chat").
    """

    prompt_style: str

    def generate(self, prompt: str, max_tokens: int, stop: Sequence[str] = ()) -> Completion:
        """Complete `prompt` greedily, up to `max_tokens`, cut at the first stop string."""
        ...

    def chat(
        self, messages: Sequence[Mapping[str, str]], max_tokens: int, stop: Sequence[str] = ()
    ) -> Completion:
        """Answer the last of `messages` (role/content dicts) greedily, through the model's
        chat template, up to `max_tokens`, cut at the first stop string."""
        ...
