"""Resumable evaluation runs: every (question, strategy) outcome is appended to a JSONL file as
soon as it exists, so a crash at question 900 keeps the first 899 and a rerun continues."""

from __future__ import annotations

import gzip
import json
from collections.abc import Callable, Iterable, Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from adaptive_rag.evaluation.datasets import Question
from adaptive_rag.evaluation.metrics import score
from adaptive_rag.strategies.base import Strategy


@dataclass
class Outcome:
    """One strategy's answer to one question, scored."""

    question_id: str
    dataset: str
    strategy: str
    answer: str
    steps: int
    seconds: float
    em: float
    f1: float
    acc: float
    passage_ids: list[str] = field(default_factory=list)
    trace: list[str] = field(default_factory=list)

    @property
    def key(self) -> tuple[str, str, str]:
        return (self.dataset, self.question_id, self.strategy)

    @property
    def correct(self) -> bool:
        return self.em > 0 or self.acc > 0


R = TypeVar("R")


def load_keyed_jsonl(path: Path, record: Callable[..., R]) -> dict[Any, R]:
    """Records of a resumable results file by their `.key` (gzipped when its name ends in .gz, as
    committed records are); a line cut short by a crash is ignored (and its work redone)."""
    records: dict[Any, R] = {}
    if not path.exists():
        return records
    with (gzip.open if path.suffix == ".gz" else open)(path, "rt", encoding="utf-8") as handle:
        for line in handle:
            try:
                item = record(**json.loads(line))
            except (json.JSONDecodeError, TypeError):
                continue
            records[item.key] = item  # type: ignore[attr-defined]
    return records


def context_reset(llm: object) -> Callable[[], None] | None:
    """The reader's way to forget its reusable prompt state, when it keeps one in this process
    (llama.cpp); a remote endpoint's server-side cache is out of reach and gets None."""
    return getattr(llm, "forget_context", None)


def load_outcomes(path: Path) -> dict[tuple[str, str, str], Outcome]:
    """Outcomes already on disk (see `load_keyed_jsonl`)."""
    return load_keyed_jsonl(path, Outcome)


def _end_last_line(path: Path) -> None:
    """Terminate a last line cut short by a crash, so appended records start on their own line."""
    if path.exists() and path.stat().st_size:
        with path.open("rb+") as handle:
            handle.seek(-1, 2)
            if handle.read(1) != b"\n":
                handle.write(b"\n")


def run_evaluation(
    questions: Iterable[Question],
    strategies: Mapping[str, Strategy],
    results_path: Path,
    on_progress: Callable[[int], None] | None = None,
    fresh_context: Callable[[], None] | None = None,
) -> dict[tuple[str, str, str], Outcome]:
    """Run every strategy on every question not yet in `results_path`; return all outcomes.

    `fresh_context` is called before each run (`context_reset(llm)`), so that no run's time
    benefits from the prompt state the previous strategy left in the same reader process."""
    results_path.parent.mkdir(parents=True, exist_ok=True)
    outcomes = load_outcomes(results_path)
    _end_last_line(results_path)
    with results_path.open("a", encoding="utf-8") as sink:
        for question in questions:
            for name, strategy in strategies.items():
                key = (question.dataset, question.id, name)
                if key not in outcomes:
                    if fresh_context:
                        fresh_context()
                    result = strategy.run(question.question)
                    outcome = Outcome(
                        question_id=question.id, dataset=question.dataset, strategy=name,
                        answer=result.answer, steps=result.steps,
                        seconds=result.timings.get("total", 0.0),
                        passage_ids=[p.id for p in result.passages], trace=result.trace,
                        **score(result.answer, question.answers),
                    )
                    sink.write(json.dumps(asdict(outcome)) + "\n")
                    sink.flush()
                    outcomes[key] = outcome
                if on_progress:
                    on_progress(1)
    return outcomes
