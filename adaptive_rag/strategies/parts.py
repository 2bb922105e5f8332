"""Tier C for a question that asks two things ("Which plan is required for the Developer API, and
what is its rate limit?"): each part is answered on its own, by tier B's reader over the part's
own retrieval, and the replies are joined.

Why: one reader call over both parts' passages makes a small reader drop a part even when both
parts' passages were retrieved ("1600 lumens, 1600 lumens" for two products; the plan with no
rate limit), and a longer prompt costs its prefill. Two single-part reads are what the reader
does best, each over a B-sized prompt. With an LLM server the parts are read at once, on its
parallel slots (`parallel`), so the answer takes about one B read on an idle server instead of
two; with a model in this process they are read one after the other.

A question of one part (`routing.rules.question_parts` finds no second question) goes to the
wrapped multi-step strategy (`whole`) unchanged. Each part abstains as tier B does (retrieval gate,
and the reader's marker with `reader_abstains`); the reply then says which part the knowledge base
does not answer, and only when every part abstains does the whole reply abstain.

Retrieval runs here, one part after the other (milliseconds); only the reader calls run in
threads, each in a copy of the caller's context (its trace), with its tokens metered on its own and
added to the run's meters when it returns.
"""

from __future__ import annotations

import contextvars
import re
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from adaptive_rag.contracts import AnswerStyle
from adaptive_rag.domain import Passage, StrategyResult, Usage
from adaptive_rag.ports import LLM, Retriever
from adaptive_rag.routing.rules import question_parts
from adaptive_rag.strategies.abstention import Abstention, abstained
from adaptive_rag.strategies.base import PhaseTimer, Strategy, add_usage, metered_alone
from adaptive_rag.strategies.single_step import READER_FOUND_NONE, answer_in_style, says_no_answer

_CITATION = re.compile(r"\[(\d{1,3})\]")
# What a support reply says for a part the knowledge base does not answer (the customer sees it).
UNANSWERED_PART = "I could not find an answer to \"{part}\" in the help centre."


@dataclass
class _Part:
    question: str
    passages: list[Passage]
    abstain_reason: str | None = None
    answer: str = ""
    usage: Usage | None = None


@dataclass
class PartsInParallel:
    """See the module. `name` is the wrapped strategy's: the tier's strategy as configured."""

    retriever: Retriever
    llm: LLM
    whole: Strategy
    top_k: int = 5
    abstention: Abstention = Abstention()
    reader_abstains: bool = False
    style: AnswerStyle = AnswerStyle.SHORT
    # How many parts are read at once: the LLM server's slots for this call; 1 reads them in turn
    # (a model in this process serves one call at a time).
    parallel: int = 2
    # Each part's reader gets only its passages' best sentences, up to this many tokens (None: whole).
    evidence_tokens: int | None = None

    @property
    def name(self) -> str:
        return self.whole.name

    def run(self, question: str) -> StrategyResult:
        asked = question_parts(question)
        if len(asked) < 2:
            return self.whole.run(question)
        timer = PhaseTimer()
        parts: list[_Part] = []
        with timer.phase("retrieve"):
            for text in asked:
                found = self.retriever.search(text, self.top_k)
                parts.append(_Part(text, found, self.abstention.reason(self.retriever, text, found)))
        to_read = [part for part in parts if part.abstain_reason is None]
        with timer.phase("generate"):
            self._read(to_read)
        for part in to_read:
            add_usage(part.usage)
            if self.reader_abstains and says_no_answer(part.answer, self.style):
                part.abstain_reason, part.answer = READER_FOUND_NONE, ""
        passages = _merged(parts)
        trace = [f"{len(parts)} parts, read {'at once' if self.parallel > 1 else 'in turn'}: "
                 + " | ".join(p.question for p in parts)]
        trace += [f"part {i}: {p.abstain_reason}" for i, p in enumerate(parts, 1) if p.abstain_reason]
        answered = [p for p in parts if p.abstain_reason is None]
        if not answered:
            return abstained(self.name, passages, len(parts), timer.finish(), parts[0].abstain_reason or "", trace)
        return StrategyResult(strategy=self.name, answer=self._join(parts, passages), steps=len(parts),
                              passages=passages, timings=timer.finish(), trace=trace)

    def _read(self, parts: Sequence[_Part]) -> None:
        """Each part's reply from its own passages, `parallel` at a time."""
        def read(part: _Part) -> None:
            with metered_alone() as usage:
                part.answer = answer_in_style(self.llm, part.question, part.passages, self.style,
                                              self.reader_abstains, self.evidence_tokens)
            part.usage = usage

        if self.parallel <= 1 or len(parts) <= 1:
            for part in parts:
                read(part)
            return
        with ThreadPoolExecutor(min(self.parallel, len(parts)), thread_name_prefix="part-reader") as pool:
            futures = [pool.submit(contextvars.copy_context().run, read, part) for part in parts]
            for future in futures:
                future.result()

    def _join(self, parts: Sequence[_Part], passages: Sequence[Passage]) -> str:
        """One reply: each part's answer in order, its citations renumbered to `passages`; a part
        the knowledge base does not answer says so (support) or is left out (short)."""
        number = {p.id: i for i, p in enumerate(passages, 1)}
        replies: list[str] = []
        for part in parts:
            if part.abstain_reason is not None:
                if self.style == AnswerStyle.SUPPORT:
                    replies.append(UNANSWERED_PART.format(part=part.question.rstrip("?. ")))
                continue
            if self.style != AnswerStyle.SUPPORT:
                replies.append(part.answer)
                continue

            def renumber(match: re.Match[str], part: _Part = part) -> str:
                n = int(match.group(1))
                if not 1 <= n <= len(part.passages):
                    return match.group(0)
                return f"[{number[part.passages[n - 1].id]}]"

            replies.append(_CITATION.sub(renumber, part.answer))
        return ("\n\n" if self.style == AnswerStyle.SUPPORT else "; ").join(replies)


def _merged(parts: Sequence[_Part]) -> list[Passage]:
    """Every part's passages, each once, in part order (the reply's sources and citation numbers)."""
    seen: dict[str, Passage] = {}
    for part in parts:
        for passage in part.passages:
            seen.setdefault(passage.id, passage)
    return list(seen.values())
