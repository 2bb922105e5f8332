"""Tier C, faithful IRCoT (Trivedi et al. 2023).

Round 1 retrieves with the question; every later round retrieves with the reasoning sentence
just written. Each round (retrieve + generate one sentence) is one step. The loop stops when the
model writes "So the answer is: ...", or at `max_steps`; at the cap the shared reader answers
from the gathered passages (a generation without retrieval, not counted as a step).

Two knobs, off in the paper's form and tuned per reader on `train` (`ReaderModel.tuning`):
`min_steps` (an answer written earlier is treated as a reasoning sentence and retrieved with) and
`reader_answers` (the shared reader writes the final answer from all gathered passages).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from adaptive_rag.contracts import AnswerStyle, StrategyName
from adaptive_rag.domain import Passage, StrategyResult
from adaptive_rag.ports import LLM, Retriever
from adaptive_rag.prompts import format_passages
from adaptive_rag.prompts import ircot as prompt
from adaptive_rag.strategies.abstention import Abstention, abstained
from adaptive_rag.strategies.base import PhaseTimer, ask, clean_answer, merge_passages
from adaptive_rag.strategies.single_step import answer_in_style

# Leading "1." / "2)" / "-" the small model likes to start a line with; not a sentence.
_ENUMERATION = re.compile(r"^(?:\d+[.)]|[-*])\s*")


def first_sentence(text: str) -> str:
    """The first sentence of `text`: up to the first '. ' (or ?, !) or the line end."""
    line = _ENUMERATION.sub("", text.strip().split("\n", 1)[0]).strip()
    if prompt.ANSWER_MARKER in line:  # keep the answer clause whole, whatever it holds
        return line
    for end in (". ", "? ", "! "):
        cut = line.find(end)
        if cut >= 0:
            return line[: cut + 1]
    return line


@dataclass
class IRCoT:
    retriever: Retriever
    llm: LLM
    top_k: int = 5
    max_steps: int = 4
    max_passages: int = 8
    # False is the paper's form; True adds the question to every follow-up query.
    query_with_question: bool = False
    # Rounds run before an answer is accepted (1: the paper's form). A small reader tends to
    # answer in round 1, which makes IRCoT a wordier single step; with 2 the first sentence
    # (usually naming the bridge entity) is retrieved with before the answer.
    min_steps: int = 1
    # False: the answer is the text after "So the answer is:" (the paper's form); True: the
    # shared reader answers from every gathered passage (a short answer, not a sentence).
    reader_answers: bool = False
    # When to abstain, judged on round 1's retrieval (the question's own) before any generation.
    abstention: Abstention = Abstention()
    # `support`: the shared reader always writes the final answer, in full with citations.
    style: AnswerStyle = AnswerStyle.SHORT
    name: str = StrategyName.IRCOT

    def run(self, question: str) -> StrategyResult:
        timer = PhaseTimer()
        passages: list[Passage] = []
        reasoning: list[str] = []
        answer: str | None = None
        query = question
        steps = 0
        while steps < self.max_steps:
            steps += 1
            with timer.phase("retrieve"):
                passages = merge_passages(
                    passages, self.retriever.search(query, self.top_k), self.max_passages
                )
            if steps == 1:
                why = self.abstention.reason(self.retriever, question, passages)
                if why is not None:
                    return abstained(self.name, passages, steps, timer.finish(), why)
            with timer.phase("generate"):
                completion = ask(
                    self.llm, prompt.PROMPT, passages=format_passages(passages),
                    question=question, reasoning=" ".join(reasoning),
                )
            sentence = first_sentence(completion.text)
            if prompt.ANSWER_MARKER in sentence:
                claim, said = sentence.split(prompt.ANSWER_MARKER, 1)
                if steps >= self.min_steps or not claim.strip() or self.max_steps <= steps:
                    answer = clean_answer(said)
                    reasoning.append(sentence)
                    break
                sentence = claim.strip()  # too early: retrieve with what it said so far
            if not sentence or sentence in reasoning:  # no progress: more rounds cannot help
                break
            reasoning.append(sentence)
            query = f"{question} {sentence}" if self.query_with_question else sentence
        if self.reader_answers or not answer or self.style == AnswerStyle.SUPPORT:
            with timer.phase("generate"):
                answer = answer_in_style(self.llm, question, passages, self.style)
        return StrategyResult(
            strategy=self.name, answer=answer, steps=steps, passages=passages,
            timings=timer.finish(), trace=reasoning,
        )
