"""Tier B: one BM25 retrieval, then `LLM(q, passages)`; one step.

Support semantics: the strategy abstains without calling the LLM when its retrieval found nothing
or nothing relevant enough (`strategies.abstention`; thresholds off by default, so benchmark runs
are unchanged); with `reader_abstains` the reader gets a prompt that lets it say the passages lack
the answer, and saying so abstains too (a second gate after the retrieval gate, at no extra call:
the reply is the answer). With `abstain_min_confidence` the marker abstains only when the reader
was sure of it (its first token at least that likely, from the endpoint's log-probabilities); an
unsure marker is asked again without it, one more call. An abstaining result has `answerable=False`, an empty
answer, the reason and the passages found, so the caller can hand the query to a human.

Answer style (`AnswerStyle`): `short` reads a span; `support` reads a full answer that cites the
passages as [n] (`answer_in_style`), and a support answer citing none gets the top passage's [1]
appended, so every support reply names a source it came from.
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from dataclasses import dataclass

from adaptive_rag.contracts import AnswerStyle, StrategyName
from adaptive_rag.domain import Passage, StrategyResult
from adaptive_rag.evidence.sentences import format_evidence
from adaptive_rag.ports import LLM, Retriever
from adaptive_rag.prompts import Prompt, format_passages
from adaptive_rag.prompts import single_step as prompt
from adaptive_rag.strategies.abstention import Abstention, abstained
from adaptive_rag.strategies.base import PhaseTimer, ask, clean_answer

READER_FOUND_NONE = "the reader found no answer in the passages"
_NON_WORD = re.compile(r"[^\w]+")
_CITATION = re.compile(r"\[(\d{1,3})\]")
_SUPPORT_PREFIX = re.compile(r"^\s*(answer|reply)\s*:\s*", re.IGNORECASE)


def reader_prompt(style: AnswerStyle, abstains: bool) -> Prompt:
    """The reader's prompt for an answer style, with or without the no-answer marker."""
    if style == AnswerStyle.SUPPORT:
        return prompt.SUPPORT_ABSTAIN if abstains else prompt.SUPPORT
    return prompt.ABSTAIN if abstains else prompt.PROMPT


def cited(answer: str, passages: Sequence[Passage]) -> list[int]:
    """The passage numbers (1-based, in `passages`' order) a support answer cites, first
    citation first; numbers no passage has are not citations."""
    numbers = (int(n) for n in _CITATION.findall(answer))
    return list(dict.fromkeys(n for n in numbers if 1 <= n <= len(passages)))


def ensure_citation(answer: str, passages: Sequence[Passage]) -> str:
    """`answer` citing at least one of `passages`: one that cites none (or only numbers no
    passage has) gets the top passage's [1] appended. Without passages it is left alone."""
    if not passages or not answer.strip() or cited(answer, passages):
        return answer
    return f"{answer.rstrip()} [1]"


def clean_support_answer(text: str) -> str:
    """A support answer as the customer reads it: every line kept (steps), an 'Answer:' prefix
    and surrounding blank space dropped."""
    lines = [line.rstrip() for line in text.strip().splitlines()]
    while lines and not lines[-1].strip():
        lines.pop()
    if lines:
        lines[0] = _SUPPORT_PREFIX.sub("", lines[0])
    return "\n".join(lines).strip()


def reader_evidence(question: str, passages: Sequence[Passage], evidence_tokens: int | None = None) -> str:
    """What the reader reads: the passages whole (each cut to `PASSAGE_CHARS`), or with
    `evidence_tokens` only their sentences that answer `question`, up to that many tokens, under
    the same passage numbers (`evidence.sentences`)."""
    if not evidence_tokens:
        return format_passages(passages)
    return format_evidence(question, passages, evidence_tokens)


def answer_in_style(llm: LLM, question: str, passages: Sequence[Passage],
                    style: AnswerStyle = AnswerStyle.SHORT, abstains: bool = False,
                    evidence_tokens: int | None = None) -> str:
    """The shared reader in `style`: a span (`short`), or a full answer citing its passages
    (`support`; see `ensure_citation`). With `abstains` it may answer the no-answer marker,
    which is returned as written (`says_no_answer` tells it). `evidence_tokens`: see
    `reader_evidence`."""
    return read_in_style(llm, question, passages, style, abstains, evidence_tokens)[0]


def read_in_style(llm: LLM, question: str, passages: Sequence[Passage],
                  style: AnswerStyle = AnswerStyle.SHORT, abstains: bool = False,
                  evidence_tokens: int | None = None) -> tuple[str, float | None]:
    """`answer_in_style` and the probability of the reply's first token (None when the
    generator reports no log-probabilities): how sure the reader was of what it began with."""
    completion = ask(llm, reader_prompt(style, abstains),
                     passages=reader_evidence(question, passages, evidence_tokens), question=question)
    first = math.exp(completion.token_logprobs[0]) if completion.token_logprobs else None
    if style != AnswerStyle.SUPPORT:
        return clean_answer(completion.text), first
    answer = clean_support_answer(completion.text)
    if abstains and says_no_answer(answer, style):
        return answer, first
    return ensure_citation(answer, passages), first


def read_answer(
    llm: LLM, question: str, passages: Sequence[Passage], template: Prompt = prompt.PROMPT,
    evidence_tokens: int | None = None,
) -> str:
    """The shared reader: answer `question` from `passages` in a few words (`evidence_tokens`:
    see `reader_evidence`)."""
    completion = ask(llm, template, passages=reader_evidence(question, passages, evidence_tokens), question=question)
    return clean_answer(completion.text)


def _words(text: str) -> str:
    return " ".join(_NON_WORD.sub(" ", text.lower()).split())


def says_no_answer(answer: str, style: AnswerStyle = AnswerStyle.SHORT) -> bool:
    """True when the reader wrote the no-answer marker (any case or punctuation around it); a
    support answer must open with it (a full answer may mention the words in passing)."""
    if style == AnswerStyle.SUPPORT:
        return _words(answer).startswith(_words(prompt.NO_ANSWER_MARKER))
    return _words(prompt.NO_ANSWER_MARKER) in _words(answer)


@dataclass
class SingleStep:
    retriever: Retriever
    llm: LLM
    top_k: int = 5
    name: str = StrategyName.SINGLE_STEP
    # When to abstain before the reader runs (always when nothing is retrieved).
    abstention: Abstention = Abstention()
    # Let the reader abstain with `prompts.single_step.NO_ANSWER_MARKER`.
    reader_abstains: bool = False
    style: AnswerStyle = AnswerStyle.SHORT
    # The marker abstains only when its first token is at least this likely; an unsure marker is
    # asked again without it (None: every marker abstains; so does one without log-probabilities).
    abstain_min_confidence: float | None = None
    # The reader gets only the passages' best sentences, up to this many tokens (None: whole).
    evidence_tokens: int | None = None

    def run(self, question: str) -> StrategyResult:
        timer = PhaseTimer()
        with timer.phase("retrieve"):
            passages = self.retriever.search(question, self.top_k)
        why = self.abstention.reason(self.retriever, question, passages)
        if why is not None:
            return abstained(self.name, passages, 1, timer.finish(), why)
        with timer.phase("generate"):
            answer, confidence = read_in_style(self.llm, question, passages, self.style, self.reader_abstains,
                                               self.evidence_tokens)
            unsure = (self.abstain_min_confidence is not None and confidence is not None
                      and confidence < self.abstain_min_confidence)
            if self.reader_abstains and says_no_answer(answer, self.style) and unsure:
                answer = answer_in_style(self.llm, question, passages, self.style, abstains=False,
                                         evidence_tokens=self.evidence_tokens)
        if self.reader_abstains and says_no_answer(answer, self.style) and not unsure:
            return abstained(self.name, passages, 1, timer.finish(), READER_FOUND_NONE)
        return StrategyResult(
            strategy=self.name, answer=answer, steps=1, passages=passages, timings=timer.finish()
        )
