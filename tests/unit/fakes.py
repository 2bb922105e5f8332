"""Test doubles for the two ports (`LLM`, `Retriever`), importable as `from fakes import ...`.

pytest's default (prepend) import mode puts `tests/unit` on `sys.path` because the directory has
no `__init__.py`, so every test module here can import this file by its basename.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass

from adaptive_rag.domain import Completion, Passage


@dataclass(frozen=True)
class LLMCall:
    prompt: str
    max_tokens: int
    stop: tuple[str, ...]


class FakeLLM:
    """Scripted `LLM`: replies from a list (in order) or from `callable(prompt) -> str`.

    Every call is recorded in `calls` (prompt, max_tokens, stop). Running out of scripted replies
    fails the test loudly instead of inventing text.
    """

    def __init__(
        self, replies: Sequence[str] | Callable[[str], str] = (), prompt_style: str = "completion"
    ) -> None:
        self.prompt_style = prompt_style
        self._script: Callable[[str], str] | None = replies if callable(replies) else None
        self._replies = [] if callable(replies) else list(replies)
        self.calls: list[LLMCall] = []

    def generate(self, prompt: str, max_tokens: int, stop: Sequence[str] = ()) -> Completion:
        self.calls.append(LLMCall(prompt, max_tokens, tuple(stop)))
        if self._script is not None:
            text = self._script(prompt)
        else:
            if not self._replies:
                raise AssertionError(f"FakeLLM: no scripted reply left for call {len(self.calls)}")
            text = self._replies.pop(0)
        return Completion(
            text=text, prompt_tokens=len(prompt.split()), completion_tokens=len(text.split())
        )

    def chat(
        self, messages: Sequence[Mapping[str, str]], max_tokens: int, stop: Sequence[str] = ()
    ) -> Completion:
        """Chat calls are recorded as their messages' contents joined by blank lines."""
        return self.generate("\n\n".join(m["content"] for m in messages), max_tokens, stop)

    @property
    def prompts(self) -> list[str]:
        return [call.prompt for call in self.calls]


class FakeRetriever:
    """`Retriever` returning fixed passages (or `callable(query, k) -> passages`), at most k.

    Every call is recorded in `queries` as `(query, k)`.
    """

    def __init__(
        self,
        passages: Iterable[Passage] | Callable[[str, int], Sequence[Passage]] = (),
    ) -> None:
        self._script = passages if callable(passages) else None
        self._passages = [] if callable(passages) else list(passages)
        self.queries: list[tuple[str, int]] = []

    def search(self, query: str, k: int) -> list[Passage]:
        self.queries.append((query, k))
        found = self._script(query, k) if self._script is not None else self._passages
        return list(found)[: max(k, 0)]

    @property
    def query_texts(self) -> list[str]:
        return [query for query, _ in self.queries]


def make_passages(n: int, prefix: str = "p") -> list[Passage]:
    """`n` distinct passages with ids `{prefix}0..`, titles and texts that name their id."""
    return [
        Passage(id=f"{prefix}{i}", title=f"Title {prefix}{i}", text=f"Text of passage {prefix}{i}.")
        for i in range(n)
    ]
