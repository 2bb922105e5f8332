"""Tier C, `evidence`: gather the few passages that form the question's chain by retrieval, then
read them with ONE reader call.

A small reader composes a two-hop answer when its context is the chain and little else, and
fails when the chain is buried among many passages; IRCoT's rounds of reasoning do not pay with
it. So the work goes into the evidence, not the reading: the configured gatherer
(`adaptive_rag.evidence`, default `chain`: the first hop fused with the passages whose titles it
mentions, an entity-graph walk and each part of a two-part question) hands `budget` passages, and
the reader answers from them at once.

Engines: `bm25`, `bridge` and `parts` need only the `Retriever` port (any engine); `links`, `ppr`
and `chain` also walk the knowledge base's entity graph, held in this process's memory
(`evidence.graphs`) and built from a retriever that can list its passages (`GraphSource`: the
tantivy and OpenSearch retrievers both can); with any other retriever they gather without it.

Degenerate input never errors: no graph (the retriever cannot list its passages, or its build
failed), an empty graph, a question with no entity, a one-document knowledge base: the gatherer
falls back to B's evidence (the question's own top hits). The trace says what was gathered and
any fallback. It abstains as every retrieving strategy does (`strategies.abstention`), judged on
the question's own retrieval (the gatherer's first hop) before the reader runs, and, with
`reader_abstains`, when the reader says the passages lack the answer.
"""

from __future__ import annotations

from dataclasses import dataclass

from adaptive_rag.contracts import StrategyName
from adaptive_rag.domain import StrategyResult
from adaptive_rag.evidence import NEEDS_GRAPH, Evidence, make_gatherer
from adaptive_rag.evidence.graphs import EntityGraphs
from adaptive_rag.ports import LLM, Retriever
from adaptive_rag.prompts import evidence as prompt
from adaptive_rag.strategies.abstention import Abstention, abstained
from adaptive_rag.strategies.base import PhaseTimer
from adaptive_rag.strategies.single_step import READER_FOUND_NONE, read_answer, says_no_answer


@dataclass
class EvidenceRead:
    retriever: Retriever
    llm: LLM
    gatherer: str = "chain"
    budget: int = 5
    # Where the knowledge base's entity graph comes from (None: no graph, the gatherers that
    # walk one fall back to B's evidence).
    graphs: EntityGraphs | None = None
    # When to abstain before the reader runs (always when nothing is retrieved).
    abstention: Abstention = Abstention()
    # Let the reader abstain with `prompts.single_step.NO_ANSWER_MARKER`, as single step.
    reader_abstains: bool = False
    # The reader gets only the gathered passages' sentences that answer the question, up to this
    # many tokens (`evidence.sentences`); None: the passages whole.
    evidence_tokens: int | None = None
    name: str = StrategyName.EVIDENCE

    def gather(self, question: str) -> tuple[Evidence, list[str]]:
        """The passages for the reader and the trace saying how they were found."""
        trace: list[str] = []
        graph = None
        if self.gatherer in NEEDS_GRAPH:
            if self.graphs is None:
                trace.append("entity graph: none configured")
            else:
                found = self.graphs.lookup(self.retriever)
                graph = found.graph
                trace.append(found.note)
        evidence = make_gatherer(self.gatherer, graph).gather(question, self.retriever, self.budget)
        trace += [f"gatherer {self.gatherer}, budget {self.budget}", *evidence.steps]
        if evidence.fallback:
            trace.append(f"fell back to B's evidence: {evidence.fallback}")
        return evidence, trace

    def run(self, question: str) -> StrategyResult:
        timer = PhaseTimer()
        with timer.phase("retrieve"):
            evidence, trace = self.gather(question)
        passages = evidence.passages
        steps = max(1, evidence.searches)
        why = self.abstention.reason(self.retriever, question, evidence.question_hits or passages)
        if why is not None:
            return abstained(self.name, passages, steps, timer.finish(), why, trace)
        template = prompt.ABSTAIN if self.reader_abstains else prompt.PROMPT
        with timer.phase("generate"):
            answer = read_answer(self.llm, question, passages, template, self.evidence_tokens)
        if self.reader_abstains and says_no_answer(answer):
            return abstained(self.name, passages, steps, timer.finish(), READER_FOUND_NONE, trace)
        return StrategyResult(
            strategy=self.name, answer=answer, steps=steps, passages=passages, timings=timer.finish(),
            trace=trace,
        )
