"""Tier C, `evidence`: gather the few passages that form the question's chain by retrieval, then
read them with ONE reader call.

A small reader composes a two-hop answer when its context is the chain and little else, and
fails when the chain is buried among many passages; IRCoT's rounds of reasoning do not pay with
it. So the work goes into the evidence, not the reading: the configured gatherer
(`adaptive_rag.evidence`, default `chain`: the first hop fused with the passages whose titles it
mentions, an entity-graph walk and each part of a two-part question, and the best hit of a focused
second hop placed fifth) hands `budget` passages, and the reader answers from them at once.

Engines: `bm25`, `bridge`, `parts` and `focused` need only the `Retriever` port (any engine); `links`, `ppr`
and `chain` also walk the knowledge base's entity graph, held in this process's memory
(`evidence.graphs`) and built from a retriever that can list its passages (`GraphSource`: the
tantivy and OpenSearch retrievers both can); with any other retriever they gather without it.

With `compare_sides`, a comparison question ("Which film came out first, A or B?", "Are A and B
of the same nationality?") is read per side (`evidence.comparison`): each side's own few passages
give that side's fact in a single-hop read, and a rule (two dates or numbers and the question's
direction) or one read of the two facts alone answers it.

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
from adaptive_rag.domain import Passage, StrategyResult
from adaptive_rag.evidence import NEEDS_GRAPH, Evidence, make_gatherer
from adaptive_rag.evidence.comparison import MEASURE_WORDS, Comparison, decide, split_comparison
from adaptive_rag.evidence.graphs import EntityGraphs
from adaptive_rag.ports import LLM, Retriever
from adaptive_rag.prompts import evidence as prompt
from adaptive_rag.strategies.abstention import Abstention, abstained
from adaptive_rag.strategies.base import PhaseTimer, ask, clean_answer
from adaptive_rag.strategies.single_step import READER_FOUND_NONE, read_answer, reader_evidence, says_no_answer


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
    # Comparison questions ("Which ..., A or B?", "Are A and B of the same ...?") read per side
    # (`evidence.comparison`): each side's own passages, `side_budget` of them, give its fact, and
    # a rule or one read of the two facts compares them. Off: read at once like any question.
    compare_sides: bool = False
    side_budget: int = 3
    name: str = StrategyName.EVIDENCE

    def gather(self, question: str, budget: int | None = None) -> tuple[Evidence, list[str]]:
        """The passages for the reader and the trace saying how they were found."""
        budget = budget or self.budget
        trace: list[str] = []
        graph = None
        if self.gatherer in NEEDS_GRAPH:
            if self.graphs is None:
                trace.append("entity graph: none configured")
            else:
                found = self.graphs.lookup(self.retriever)
                graph = found.graph
                trace.append(found.note)
        evidence = make_gatherer(self.gatherer, graph).gather(question, self.retriever, budget)
        trace += [f"gatherer {self.gatherer}, budget {budget}", *evidence.steps]
        if evidence.fallback:
            trace.append(f"fell back to B's evidence: {evidence.fallback}")
        return evidence, trace

    def run(self, question: str) -> StrategyResult:
        comparison = split_comparison(question) if self.compare_sides else None
        if comparison is not None:
            return self._compare(comparison)
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

    def _compare(self, comparison: Comparison) -> StrategyResult:
        """Each side's fact from its own passages, then the rule or one read of the two facts."""
        timer = PhaseTimer()
        trace = [f"comparison ({comparison.kind}{', ' + comparison.direction if comparison.direction else ''}): "
                 f"{comparison.sides[0]!r} vs {comparison.sides[1]!r}, read per side"]
        sides: list[Evidence] = []
        with timer.phase("retrieve"):
            for side in comparison.sides:
                evidence, steps = self.gather(comparison.side_query(side), self.side_budget)
                sides.append(evidence)
                trace += [f"{side}: {step}" for step in steps]
        passages = list({p.id: p for e in sides for p in e.passages}.values())
        hits = [p for e in sides for p in (e.question_hits or e.passages)]
        searches = sum(max(1, e.searches) for e in sides)
        why = self.abstention.reason(self.retriever, comparison.question, hits)
        if why is not None:
            return abstained(self.name, passages, searches, timer.finish(), why, trace)
        with timer.phase("generate"):
            facts = tuple(
                clean_answer(ask(self.llm, prompt.SIDE, side=side, measure=MEASURE_WORDS[comparison.measure],
                                 question=comparison.question,
                                 passages=reader_evidence(comparison.question, e.passages, self.evidence_tokens)).text)
                for side, e in zip(comparison.sides, sides)
            )
            trace += [f"{side}: {fact!r}" for side, fact in zip(comparison.sides, facts)]
            answer = decide(comparison, facts)  # type: ignore[arg-type]
            if answer is not None:
                trace.append(f"decided by rule: {answer!r}")
            else:
                facts_read = [Passage(f"fact-{i}", side, fact or "(not found)")
                              for i, (side, fact) in enumerate(zip(comparison.sides, facts))]
                answer = read_answer(self.llm, comparison.question, facts_read, prompt.PROMPT)
                trace.append("the two facts read together")
        return StrategyResult(strategy=self.name, answer=answer, steps=searches + 1, passages=passages,
                              timings=timer.finish(), trace=trace)

